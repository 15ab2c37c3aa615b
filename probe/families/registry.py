"""The one registry of model families, and the one way to find a model's.

    register(family)             make a family known; a second family of the same name is an
                                 error (as torchvision's register_model refuses one)
    family_for(model_cfg, model) the family registered by the module that builds the model
                                 (its config's ``_target_``), else the first registered family
                                 that recognises the model's classes, else ``Family()``; given
                                 the built model, the family that serves it (``specialise``,
                                 one step)

A family module ends with ``FAMILY = register(MyFamily())``. The shipped ones are imported for
a lookup by class only where their library already is: no model can be made of the classes of
a library that this process has not imported.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from omegaconf import DictConfig
from torch import nn

from probe.families.base import Family

__all__ = ["register", "family_for", "known_families", "model_libraries"]

# the family modules shipped with probe, by the library whose classes they recognise
_SHIPPED = {"torchvision": "probe.families.torchvision", "timm": "probe.families.timm",
            "transformers": "probe.families.transformers",
            "open_clip": "probe.families.open_clip"}
_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make ``family`` known by its name.

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
    imported."""
    for library, module in _SHIPPED.items():
        if library in sys.modules:
            importlib.import_module(module)
    return list(_REGISTRY.values())


def family_for(model_cfg: DictConfig | dict | None, model: nn.Module | None = None) -> Family:
    """The family of a model (see the module's docstring)."""
    target = str((model_cfg or {}).get("_target_", "") or "")
    module = target.rpartition(".")[0]
    found = None
    if module:
        with contextlib.suppress(ImportError):  # a family module registers its family
            importlib.import_module(module)
        found = next((f for f in _REGISTRY.values() if type(f).__module__ == module), None)
    if found is None and model is not None:
        found = next((f for f in known_families() if f.recognizes(model)), None)
    found = found or Family()
    return found if model is None else found.specialise(model)


def model_libraries() -> tuple[str, ...]:
    """The packages whose classes only change with their version: torch and each family's."""
    return ("torch", *dict.fromkeys(lib for f in known_families() for lib in f.libraries))
