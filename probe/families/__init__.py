"""Model families: what one library's models need, declared in one module each.

A family says how its models are built (the ``_target_`` functions of its module, which Hydra
calls), which preprocessing they expect, which of their outputs are token layouts and where
their special tokens are, how a batch is fed to them, how their logits are read, and which
objectives they support. The core looks a family up and never names one:

    family_for(model_cfg, model)   the family of the module that ``model._target_`` names (its
                                   module-level ``FAMILY``), else the first known family that
                                   recognises the model's classes, else ``Family()``, the plain
                                   behaviour for any nn.Module

Families shipped: probe.families.torchvision, .timm, .transformers (with .hf_vision for
checkpoints that read pixels), .open_clip. Adding one is a module that
defines ``FAMILY = register(MyFamily())`` and a YAML file in conf/model/.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from omegaconf import DictConfig
from torch import nn

from probe.errors import ConfigError
from probe.layers import first_tensor

__all__ = ["Family", "TokenLayout", "register", "family_for", "known_families",
           "model_libraries"]

# the family modules shipped with probe, by the library whose classes they recognise: one is
# imported for a lookup by a model's classes only where its library already is
_SHIPPED = {"torchvision": "probe.families.torchvision", "timm": "probe.families.timm",
            "transformers": "probe.families.transformers",
            "open_clip": "probe.families.open_clip"}
_REGISTRY: dict[str, Family] = {}


@dataclass(frozen=True)
class TokenLayout:
    """Where a model's outputs with a token axis, (B, length, ...), keep what.

    ``keep`` (B, length) marks the positions whose rows count (a language model's real tokens,
    never its padding), or is None when every position does (a vision transformer's); the
    first ``prefix`` positions are special tokens (class, registers), and the patches after
    them lie on ``grid`` (rows, columns), where the model has one. ``axis`` names a position
    in the file's ``dims`` attr. ``row_sample`` (rows,) says which sample of the batch each
    of the model's rows belongs to, where a sample is fed as several rows (the windows of a
    long recording, in order), or is None: a row per sample.
    """

    length: int
    keep: torch.Tensor | None = None
    prefix: int = 0
    grid: tuple[int, int] | None = None
    axis: str = "token"
    row_sample: torch.Tensor | None = None

    def to(self, device: torch.device) -> TokenLayout:
        if self.keep is None:
            return self
        rows = None if self.row_sample is None else self.row_sample.to(device, non_blocking=True)
        return replace(self, keep=self.keep.to(device, non_blocking=True), row_sample=rows)

    @property
    def lengths(self) -> torch.Tensor | None:
        """(samples,) kept positions of each sample (None when every position is kept)."""
        if self.keep is None:
            return None
        per_row = self.keep.sum(1)
        if self.row_sample is None:
            return per_row
        samples = int(self.row_sample.max()) + 1 if len(self.row_sample) else 0
        return torch.zeros(samples, dtype=per_row.dtype).index_add_(0, self.row_sample.cpu(),
                                                                     per_row.cpu())


class Family:
    """The behaviour of any nn.Module that maps a tensor to (N, classes) logits; families
    override what differs. Every method is given the built model (in eval mode)."""

    name = "torch"
    # packages whose classes change only with the package's version (the file records the
    # version, so the model fingerprint leaves their source out)
    libraries: tuple[str, ...] = ()

    def recognizes(self, model: nn.Module) -> bool:
        """Whether ``model`` (built by code outside the family, e.g. a user's model) is made of
        this family's classes."""
        return False

    def specialise(self, model: nn.Module) -> Family:
        """The family that serves this built model, where one library's models read different
        kinds of input (a Hugging Face checkpoint reads token ids, pixels or sound, each served
        by a module of its own); ``self`` by default."""
        return self

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        """The evaluation preprocessing that the model was trained with (for
        ``dataset.transform=auto``), found from its config without building it; None: the
        dataset's own default."""
        return None

    def tokenizer(self, model_cfg: DictConfig) -> Callable | None:
        """The model's own text tokenizer (for ``dataset.tokenizer=auto``), as a callable
        (list of texts) -> (ids, attention mask), both (B, length) at one fixed length, found
        from its config; None: the model has none."""
        return None

    def place(self, model: nn.Module, device: torch.device, asked: str
              ) -> tuple[nn.Module, torch.device]:
        """The model on ``device``, and the device its inputs go to."""
        return model.to(device), device

    def check_data(self, model: nn.Module, feed) -> None:
        """Refuse data that this model cannot read (``feed``: the dataset's feed).

        Raises:
            ConfigError: saying which data the model reads.
        """

    def check_layers(self, model: nn.Module, feed, reduces) -> None:
        """Refuse layers that this data does not run (a two-tower model's other tower), or
        whose reduce it cannot honour; ``reduces``: each hooked layer's reduce (a Reduce).

        Raises:
            ConfigError: naming the layer and what the data feeds.
        """

    def token_layout(self, model: nn.Module, batch) -> TokenLayout | None:
        """The token layout of the model's outputs for ``batch`` (on the CPU), or None when its
        outputs have no token axis."""
        return None

    def forward(self, model: nn.Module, batch, *, input_grad: bool = False):
        """The model's output for a batch on the device; with ``input_grad`` the autograd graph
        starts at the input itself."""
        inputs = batch.inputs
        if input_grad:
            inputs = inputs.requires_grad_()
        return model(**inputs) if isinstance(inputs, dict) else model(inputs)

    def logits(self, output) -> torch.Tensor | None:
        """The logits in the model's output (its first tensor), or None."""
        return first_tensor(output)[0]

    def objective(self, name: str, model: nn.Module) -> Callable:
        """The named objective as (output, batch) -> one value per sample (probe.objectives).

        Raises:
            ConfigError: a name this model cannot give, saying what it needs.
        """
        from probe import objectives

        if name == "nll":
            raise ConfigError("objective=nll is a language model's next-token loss; this model "
                              "gives class logits: use objective=top1 or target (nll needs "
                              "model=transformers with dataset=text)")
        if name not in ("top1", "target"):
            raise ConfigError(f"objective={name!r} is unknown; use top1, target, or a config "
                              "with a _target_ callable (logits, targets) -> one value per "
                              "sample")
        function = getattr(objectives, name)
        return lambda output, batch: function(objectives.class_logits(self.logits(output)),
                                              batch.target)

    def example_batch(self, model: nn.Module):
        """A batch of the model's own making, for listing its layers without a dataset; None
        where it needs data."""
        return None


def register(family: Family) -> Family:
    """Make ``family`` known by its name, for lookups by model class.

    Raises:
        ValueError: another family already has that name.
    """
    known = _REGISTRY.get(family.name)
    if known is not None and type(known) is not type(family):
        raise ValueError(f"two model families are named {family.name!r}: "
                         f"{type(known).__qualname__} and {type(family).__qualname__}")
    _REGISTRY[family.name] = family
    return family


def known_families() -> list[Family]:
    """Every family registered so far, and each shipped one whose library this process has
    imported (no model can be made of the classes of a library that is not)."""
    for library, module in _SHIPPED.items():
        if library in sys.modules:
            importlib.import_module(module)
    return list(_REGISTRY.values())


def family_for(model_cfg: DictConfig | None, model: nn.Module | None = None) -> Family:
    """The family of a model: the ``FAMILY`` of the module that builds it (by its config's
    ``_target_``), else the first known family that recognises ``model``, else ``Family()``;
    given the built model, the family that it specialises to (``Family.specialise``)."""
    target = str((model_cfg or {}).get("_target_", "") or "")
    module_name = target.rpartition(".")[0]
    if module_name:
        try:
            family = getattr(importlib.import_module(module_name), "FAMILY", None)
        except ImportError:
            family = None
        if isinstance(family, Family):
            return family if model is None else family.specialise(model)
    if model is not None:
        for family in known_families():
            if family.recognizes(model):
                return family.specialise(model)
    return Family()


def model_libraries() -> tuple[str, ...]:
    """The packages whose classes only change with their version: torch and each family's."""
    return ("torch", *dict.fromkeys(lib for f in known_families() for lib in f.libraries))
