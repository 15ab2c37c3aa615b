"""Capture kinds: what a hook captures, as data. Each kind says its name in ``hooks=``, the
dataset it fills under ``<layer>/``, how its value's axes lie (``Axes``: which runs along the
batch's positions), whether it is a gradient, the attrs its datasets carry, and how it
attaches to a model (``attach``); the hook object (probe.pipeline.hooks), the dry run, the
per-key transform and the plan only ask it.

    forward         -> <layer>/output        the module's output (first tensor of a tuple)
    forward_pre     -> <layer>/input         the module's first input (positional, or keyword)
    backward        -> <layer>/grad_output   d objective / d output
    backward_input  -> <layer>/grad_input    d objective / d first input
    attention       -> <layer>/attention     an attention module's post-softmax weights,
                                             (B, heads, queries, keys), from the model's
                                             family, which runs that module alone eager

A new kind is a ``CaptureKind`` with its own ``attach``, registered once::

    class RowNorm(CaptureKind):
        def attach(self, target, keep):
            return hooked(m.register_forward_hook(
                lambda _, args, out, layer=layer: keep(layer, out.norm(dim=-1, keepdim=True)))
                for layer, m in target.modules.items())

    register(RowNorm(hook="row_norm", kind="norm"))      # hooks=[row_norm] -> <layer>/norm
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from probe.data.layouts import POSITIONS_FIRST, Axes
from probe.errors import ConfigError
from probe.families.base import Family, first_tensor
from probe.file.format import Attr

__all__ = ["CaptureKind", "Target", "Keep", "Check", "register", "capture_kinds", "hooked",
           "ATTENTION"]

# how a kind hands a value over: (layer, tensor, where it sat: a tuple position or keyword)
Keep = Callable[[str, torch.Tensor, int | str | None], None]
# what a kind can say of layers that gave it no value in a pass: raises a ConfigError
Check = Callable[[list[str]], None]


@dataclass(frozen=True)
class Target:
    """What a kind attaches to: the model, each hooked layer's module by name, and the
    model's family (for what only a family can give, such as attention patterns)."""

    model: nn.Module
    modules: Mapping[str, nn.Module]
    family: Family  # the hook object's (found from the model's classes where not given)


@dataclass(frozen=True)
class CaptureKind:
    """One kind of value a hook captures (see the module's docstring).

    ``hook`` is its name in ``hooks=``, ``kind`` its dataset under ``<layer>/`` (never ending
    in ``_<digits>``, which numbers later calls); ``of`` names what of a module it reads, for
    messages. A gradient kind (``needs_grad``) hands over the tensor it differentiates at:
    its value is d objective / d that tensor; ``from_input``: the graph must start at the
    model's input (every path from the tensor counts, those that bypass the module too).
    ``attrs`` go on each of its datasets.
    """

    hook: str
    kind: str
    of: str = "output"
    axes: Axes = POSITIONS_FIRST
    needs_grad: bool = False
    from_input: bool = False
    attrs: Mapping[str, object] = field(default_factory=dict)

    def root_attrs(self, layers: list[str]) -> dict:
        """The file's root attrs of a run that hooks ``layers`` with this kind."""
        return {}

    def attach(self, target: Target, keep: Keep) -> AbstractContextManager[Check | None]:
        """For a ``with`` block, hooks on ``target`` that hand each value to ``keep``; the
        block gets a check of layers that gave no value, or None. Every hook is removed
        when the block ends, however it ends.

        Raises:
            ConfigError: the kind cannot be captured from this model.
        """
        raise NotImplementedError


@contextmanager
def hooked(handles: Iterable[torch.utils.hooks.RemovableHandle]) -> Iterator[None]:
    """The handles of hooks, removed (newest first) when the block ends."""
    handles = list(handles)
    try:
        yield None
    finally:
        for handle in reversed(handles):
            handle.remove()


def _output(layer: str, output) -> tuple[torch.Tensor, int | None]:
    tensor, position = first_tensor(output)
    if tensor is None:
        raise ConfigError(f"layer {layer!r} has no tensor output to capture; choose another")
    return tensor, position


def _input(layer: str, args: tuple, kwargs: dict) -> tuple[torch.Tensor, int | str | None]:
    # the first positional tensor, else the first tensor given by keyword (Llama's
    # hidden_states=...); only a later slot than the first is worth recording
    tensor, slot = first_tensor(args)
    if tensor is None:
        slot = next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
        tensor = None if slot is None else kwargs[slot]
    if tensor is None:
        raise ConfigError(f"layer {layer!r} has no tensor input to capture; choose another")
    return tensor, slot or None


class _ModuleOutput(CaptureKind):
    def attach(self, target: Target, keep: Keep) -> AbstractContextManager[None]:
        return hooked(module.register_forward_hook(
            lambda _, args, out, layer=layer: keep(layer, *_output(layer, out)))
            for layer, module in target.modules.items())


class _ModuleInput(CaptureKind):
    # first among a module's pre-hooks, so that it reads the input as the module was given
    # it (a gradient of the output may start the graph at a copy of it)
    def attach(self, target: Target, keep: Keep) -> AbstractContextManager[None]:
        return hooked(module.register_forward_pre_hook(
            lambda _, args, kwargs, layer=layer: keep(layer, *_input(layer, args, kwargs)),
            with_kwargs=True, prepend=True) for layer, module in target.modules.items())


class _OutputGradient(CaptureKind):
    def attach(self, target: Target, keep: Keep) -> AbstractContextManager[None]:
        handles = []
        for layer, module in target.modules.items():
            handles.append(module.register_forward_pre_hook(_graph_starts_here,
                                                            with_kwargs=True))
            handles.append(module.register_forward_hook(
                lambda _, args, out, layer=layer: keep(layer, *_output(layer, out))))
        return hooked(handles)


def _graph_starts_here(module: nn.Module, args: tuple, kwargs: dict):
    """Start the autograd graph at the module's input where nothing upstream is recorded
    (parameters are frozen, the model's input needs no gradient): only d/d outputs are asked
    for, and what lies downstream of this module's output is unchanged. The clone is not a
    leaf, so a module that works in place on its input (ReLU(inplace=True)) still may."""
    tensor, slot = first_tensor(args)
    if tensor is None:
        slot = next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
        tensor = None if slot is None else kwargs[slot]
    if tensor is None or not torch.is_grad_enabled() or tensor.requires_grad:
        return None
    start = tensor.detach().requires_grad_().clone()
    if isinstance(slot, str):
        return args, {**kwargs, slot: start}
    return (*args[:slot], start, *args[slot + 1:]), kwargs


class _AttentionWeights(CaptureKind):
    def root_attrs(self, layers: list[str]) -> dict:
        return {Attr.EAGER_ATTENTION: list(layers)}  # the modules that ran eager attention

    @contextmanager
    def attach(self, target: Target, keep: Keep) -> Iterator[Check]:
        hooked_modules = {module: layer for layer, module in target.modules.items()}
        with target.family.patterns(target.model, hooked_modules,
                             lambda layer, weights: keep(layer, weights, None)) as seen:
            yield lambda missing: _refuse_other_modules(missing, seen)


def _refuse_other_modules(missing: list[str], seen: Mapping[str, tuple]) -> None:
    other = [layer for layer in missing if layer not in seen]
    if other:
        named = ", ".join(seen) or "none"
        raise ConfigError(f"{other[0]} is not an attention module (it computes no attention "
                          f"weights), so hooks=[attention] has no pattern there; this model's "
                          f"attention modules: {named}")


ATTENTION = _AttentionWeights(
    hook="attention", kind="attention", of="attention weights",
    axes=Axes(position=1, names=("head", "query", "key"), keys=True,
              what="attention pattern",
              unreduced="attention patterns are stored as they are (one row per query, or one "
                        "per sample with tokens=first|last|mean)"),
    attrs={Attr.ATTENTION: "eager"})  # computed eager by the hooked module alone

_REGISTERED: dict[str, CaptureKind] = {}  # by its name in hooks=


def register(kind: CaptureKind) -> CaptureKind:
    """Make ``kind`` known to ``hooks=`` (and ``probe.attach``); returns it. Registering the
    same kind again does nothing.

    Raises:
        ValueError: a name that another kind has, or a dataset name that is not one.
    """
    if _REGISTERED.get(kind.hook) == kind:
        return kind
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", kind.kind) or re.search(r"_\d+$", kind.kind):
        raise ValueError(f"a capture kind's dataset is named by letters, digits and _, and "
                         f"never ends in _<digits>; {kind.kind!r} is not")
    for other in _REGISTERED.values():
        if kind.hook == other.hook or kind.kind == other.kind:
            raise ValueError(f"two capture kinds are named {kind.hook!r} or store "
                             f"<layer>/{kind.kind}")
    _REGISTERED[kind.hook] = kind
    return kind


for _kind in (_ModuleOutput(hook="forward", kind="output"),
              _ModuleInput(hook="forward_pre", kind="input", of="input"),
              _OutputGradient(hook="backward", kind="grad_output", needs_grad=True),
              _ModuleInput(hook="backward_input", kind="grad_input", of="input",
                           needs_grad=True, from_input=True),
              ATTENTION):
    register(_kind)


def capture_kinds(hooks: Iterable[str | CaptureKind]) -> list[CaptureKind]:
    """The kinds that ``hooks`` name (or are), in order, without repeats.

    Raises:
        ConfigError: an unknown name or an empty list.
    """
    kinds: list[CaptureKind] = []
    for hook in hooks:
        kind = hook if isinstance(hook, CaptureKind) else _REGISTERED.get(str(hook))
        if kind is None:
            raise ConfigError(f"hook {str(hook)!r} is unknown; use any of "
                              f"{', '.join(_REGISTERED)}")
        if kind not in kinds:
            kinds.append(kind)
    if not kinds:
        raise ConfigError("hooks is empty; use e.g. 'hooks=[forward]'")
    return kinds
