"""Model families: what one library's models need, declared in one module each.

A family says how its models are built (the ``_target_`` functions of its module, which Hydra
calls), which preprocessing they expect, how a batch is fed to them and its row layout and
logits read, and which data and layers they cannot take (probe.families.base). The core looks
a family up (probe.families.registry) and never names one.

Families shipped: probe.families.torchvision, .timm, .transformers (which hands a checkpoint
that reads pixels to .hf_vision and one that reads sound to .hf_audio, sharing .hub), and
.open_clip; .towers holds what two-tower models share. Adding one is a module that defines
``FAMILY = register(MyFamily())`` and a YAML file in conf/model/.
"""

from probe.families.base import Family
from probe.families.registry import family_for, register

__all__ = ["Family", "register", "family_for"]
