"""probe: capture what PyTorch models compute inside, into chunked HDF5 files.

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

__all__ = ["run", "plan", "execute", "attach", "open", "Capture", "FeatureFile", "ProbeError",
           "__version__"]

_LAZY = {
    "run": "probe.runner",
    "plan": "probe.planner",
    "execute": "probe.runner",
    "attach": "probe.hooks",
    "Capture": "probe.hooks",
    "open": "probe.read",
    "FeatureFile": "probe.read",
    "ProbeError": "probe.errors",
}

if TYPE_CHECKING:
    from probe.errors import ProbeError
    from probe.hooks import Capture, attach
    from probe.planner import plan
    from probe.read import FeatureFile, open
    from probe.runner import execute, run


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
