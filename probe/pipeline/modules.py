"""Layer names: resolve dotted paths and globs to modules, and list what a model offers.

``resolve_layers`` turns the config's ``layers`` into module names, or fails naming the pattern,
the closest real names and how to list them all. ``describe_layers`` runs one forward pass and
reports every module's output shape and how often it ran; ``python -m probe.layers model=...``
prints it with the bytes each sample (or token) adds to a file.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from probe.errors import ConfigError
from probe.families.base import first_tensor
from probe.families.names import StandardNames, is_standard

__all__ = ["resolve_layers", "match_layers", "is_glob", "describe_layers", "LayerInfo",
           "lays_channels_first", "frozen_parameters"]

_GLOB_CHARS = set("*?[")


def resolve_layers(model: nn.Module, patterns: Iterable[str],
                   names: StandardNames | None = None) -> dict[str, str]:
    """The layers that ``patterns`` name, each by the name its datasets take -> its module's
    path, in the model's module order (standard names in depth order after them), without
    repeats.

    A pattern is a name as ``model.named_modules()`` gives it (``features.28``), a shell-style
    glob over those names (``features.2*``, ``layer4.*``), or a standard name
    (``blocks.6``, ``blocks.*``, ``blocks.50%``, ``lm_head``: probe.families.names) that
    ``names`` resolves for this model; a module that the model names so itself wins.

    Raises:
        ConfigError: no patterns, a pattern that matches no module, or a standard name the
            model has no part for.
    """
    patterns = [str(p) for p in patterns]
    if not patterns:
        raise ConfigError(
            "layers is empty; name at least one module, e.g. 'layers=[features.28]' "
            "(python -m probe.layers model=<model> lists them)"
        )
    paths = [name for name, _ in model.named_modules() if name]
    chosen: set[str] = set()
    standard: dict[str, str] = {}
    for pattern in patterns:
        hits = match_layers(paths, pattern)
        if hits:
            chosen.update(hits)
        elif is_standard(pattern):
            if names is None:
                raise ConfigError(f"{pattern} is a standard name, which {type(model).__name__}'s "
                                  "family does not resolve (Hugging Face models' does); name "
                                  "its modules by path (python -m probe.layers lists them)")
            standard.update(names.expand(pattern))
        else:
            raise ConfigError(_unknown_layer_message(pattern, paths))
    found = {path: path for path in paths if path in chosen}
    for name, path in standard.items():
        twice = next((other for other, hooked in found.items() if hooked == path), None)
        if twice is not None:
            raise ConfigError(f"layers names {path} twice, as {twice} and as {name}; keep one")
        found[name] = path
    return found


def match_layers(names: Iterable[str], pattern: str) -> list[str]:
    """The names equal to ``pattern``, or matching it as a shell-style glob, in order."""
    glob = is_glob(pattern)
    return [name for name in names
            if name == pattern or (glob and fnmatch.fnmatchcase(name, pattern))]


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` holds a glob character (``*``, ``?`` or ``[``)."""
    return bool(_GLOB_CHARS & set(pattern))


# torch's modules that take and give (N, C, L): channels first, then length
_CHANNELS_FIRST_1D = (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d,
                      nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d,
                      nn.LPPool1d)
# ... and those that give features last: (N, L, D)
_FEATURES_LAST = (nn.Linear, nn.MultiheadAttention, nn.Embedding)


def lays_channels_first(module: nn.Module) -> bool:
    """Whether a (N, A, B) tensor of ``module`` is (sample, channel, length), as a 1-d
    convolution lays it out, rather than (sample, token, feature), as linear layers, attention
    and embeddings (so transformer blocks, a ViT's patch embedding, a text tower) do. The
    module is read as a 1-d convolution where it is one, or holds one and no linear layer (a
    speech model's convolutional stem)."""
    kinds = [type(m) for m in module.modules()]
    return (any(issubclass(k, _CHANNELS_FIRST_1D) for k in kinds)
            and not any(issubclass(k, _FEATURES_LAST) for k in kinds))


def _unknown_layer_message(pattern: str, names: list[str]) -> str:
    close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.5)
    hint = f" Closest: {', '.join(close)}." if close else ""
    return (
        f"layer {pattern!r} matches no module of the model.{hint}{_prefix_hint(pattern, names)} "
        "List them all with: python -m probe.layers model=<your model>"
    )


def _prefix_hint(pattern: str, names: list[str]) -> str:
    # a model built without the wrapper that holds it (a Hugging Face model.head=base, GPT2Model
    # where GPT2LMHeadModel names its modules transformer.h.N) names them without its prefix
    parts = pattern.split(".")
    for cut in range(1, len(parts)):
        shorter = ".".join(parts[cut:])
        if match_layers(names, shorter):
            prefix = ".".join(parts[:cut]) + "."
            return (f" This model names it without {prefix!r}: {shorter!r} (a model built "
                    "without the head that wraps it, as model.head=base builds one, has no "
                    "such prefix).")
    return ""


@dataclass(frozen=True)
class LayerInfo:
    """One module as one sample sees it."""

    name: str
    type: str
    shape: tuple[int, ...] | None  # output shape for one sample; None when the module did not run
    calls: int  # how often the module ran in one forward pass


def describe_layers(model: nn.Module, forward: Callable[[], object]) -> list[LayerInfo]:
    """Every named module with its output shape (no batch axis) in the forward pass that
    ``forward()`` makes, typically on one sample.

    The model's mode is untouched and every hook is removed before returning.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    calls: dict[str, int] = {}

    def record(name):
        def hook(module, args, output):
            calls[name] = calls.get(name, 0) + 1
            tensor, _ = first_tensor(output)
            if tensor is not None and name not in shapes:
                shapes[name] = tuple(tensor.shape[1:])
        return hook

    modules = [(name, module) for name, module in model.named_modules() if name]
    handles = [module.register_forward_hook(record(name)) for name, module in modules]
    try:
        with torch.inference_mode():
            forward()
    finally:
        for handle in reversed(handles):
            handle.remove()
    return [LayerInfo(name, type(module).__name__, shapes.get(name), calls.get(name, 0))
            for name, module in modules]


@contextmanager
def frozen_parameters(model: nn.Module, active: bool):
    """Parameters stop requiring grad for the block (no weight gradients are built or
    accumulated); their flags are restored afterwards."""
    if not active:
        yield
        return
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)

