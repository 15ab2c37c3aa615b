"""The arguments of the factories that config groups name, as Hydra schemas, so that each
default lives in the factory's signature alone.

A group file names its factory in its defaults list and holds only what the group sets::

    # conf/model/vgg16.yaml
    defaults:
      - /probe_args/probe.families.torchvision.torchvision_model@_here_
      - _self_
    name: vgg16

``register(config_dir)`` puts one schema per named factory in Hydra's ConfigStore: its
``_target_`` and a typed field per parameter, with the parameter's default (``???`` where it
has none), so ``model.weights=DEFAULT`` overrides a value the YAML never wrote, and a mistyped
key or a value of the wrong type fails when the config is composed. The signatures are read
from the factories' source, without importing them: composing a config for images imports no
text module, nor anything else a factory imports. Dataset schemas also get ``on_error``
(probe's own key: how the loader treats a sample that cannot be loaded).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any, Optional

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

__all__ = ["GROUP", "register", "factory_defaults"]

GROUP = "probe_args"
_PACKAGE = Path(__file__).resolve().parent.parent
_TYPES = {"int": int, "float": float, "bool": bool, "str": str}
# keys of probe's own in every dataset group (build_dataset leaves them out of the arguments)
_DATASET_KEYS = {"on_error": (str, "raise")}


def register(config_dir: Path) -> None:
    """A schema for every factory that a group file under ``config_dir`` names."""
    store = ConfigStore.instance()
    for path in sorted(config_dir.glob("*/*.yaml")):
        for target in _named_factories(path):
            extra = _DATASET_KEYS if path.parent.name == "dataset" else {}
            store.store(group=GROUP, name=target, node=_schema(target, extra))


def factory_defaults(target: str) -> dict[str, Any]:
    """The parameters of the probe factory ``target`` that have defaults, and those defaults,
    as its source declares them."""
    return {name: default for name, (_, default) in _parameters(target).items()
            if default is not MISSING}


def _named_factories(path: Path) -> list[str]:
    entries = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    prefix = f"/{GROUP}/"
    return [entry[len(prefix):].split("@")[0] for entry in entries
            if isinstance(entry, str) and entry.startswith(prefix)]


def _schema(target: str, extra: dict[str, tuple[type, Any]]) -> type:
    fields = [("_target_", str, dataclasses.field(default=target))]
    for name, (kind, default) in {**_parameters(target), **extra}.items():
        fields.append((name, kind, dataclasses.field(default=default)))
    return dataclasses.make_dataclass(target.rpartition(".")[2] + "_args", fields)


def _parameters(target: str) -> dict[str, tuple[Any, Any]]:
    """{parameter: (type for OmegaConf, default or MISSING)} of a function or class of this
    package, from its source."""
    module, _, name = target.rpartition(".")
    if not module.startswith("probe."):
        raise ValueError(f"{target}: only probe's own factories have schemas")
    source = _PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(source.read_text(), str(source))
    found = next((node for node in tree.body
                  if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name),
                 None)
    if isinstance(found, ast.ClassDef):
        found = next((node for node in found.body
                      if isinstance(node, ast.FunctionDef) and node.name == "__init__"), None)
    if found is None:
        raise ValueError(f"{target}: no such function or class in {source}")
    arguments = found.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = [MISSING] * (len(positional) - len(arguments.defaults)) + [
        ast.literal_eval(node) for node in arguments.defaults]
    pairs = list(zip(positional, defaults, strict=True))
    pairs += [(arg, MISSING if node is None else ast.literal_eval(node))
              for arg, node in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)]
    return {arg.arg: (_type(arg.annotation), default) for arg, default in pairs
            if arg.arg != "self"}


def _type(annotation: ast.expr | None):
    # int, float, bool, str, and "X | None" of those, for OmegaConf to check; anything else Any
    text = "" if annotation is None else ast.unparse(annotation)
    parts = [part.strip() for part in text.split("|")]
    if len(parts) == 1 and parts[0] in _TYPES:
        return _TYPES[parts[0]]
    if len(parts) == 2 and "None" in parts:
        other = parts[1 - parts.index("None")]
        if other in _TYPES:
            return Optional[_TYPES[other]]  # noqa: UP045  (OmegaConf reads typing's form)
    return Any
