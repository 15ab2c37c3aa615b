"""probe: capture what PyTorch models compute inside, into chunked HDF5 files.

    probe.compose(["model=resnet18", ...])  a config, as the command line composes it
    probe.run(cfg)                          the whole pipeline from a composed Hydra config
    probe.execute(probe.plan(cfg, model=m)) the same in its two steps, with your own model
    with probe.attach(model, layers, hooks=("forward",)) as cap: ...
                                            hooks on for the block, removed on exit
    probe.open(path)                        read a finished file

Imports are lazy so that ``python -m probe`` starts quickly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from probe.version import __version__

__all__ = ["run", "plan", "execute", "attach", "open", "compose", "Capture", "FeatureFile",
           "ProbeError", "__version__"]

_LAZY = {
    "run": "probe.pipeline.execute",
    "plan": "probe.pipeline.plan",
    "execute": "probe.pipeline.execute",
    "attach": "probe.pipeline.hooks",
    "Capture": "probe.pipeline.hooks",
    "open": "probe.file.read",
    "FeatureFile": "probe.file.read",
    "ProbeError": "probe.errors",
    "compose": "probe.config.compose",
}

if TYPE_CHECKING:
    from probe.config.compose import compose
    from probe.errors import ProbeError
    from probe.file.read import FeatureFile, open
    from probe.pipeline.execute import execute, run
    from probe.pipeline.hooks import Capture, attach
    from probe.pipeline.plan import plan


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
