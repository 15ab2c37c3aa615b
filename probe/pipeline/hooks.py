"""Hooks owned by a context manager: attached on entry, every one removed on exit, even on error.

``attach(model, layers, hooks)`` returns a ``Capture``. Inside the ``with`` block each forward pass
leaves, under ``"<layer>/<kind>"``, a copy of what the hooked modules saw, taken at hook time (so
an in-place op that runs later, such as vgg16's ReLU after ``features.28``, cannot change it).
Gradient kinds are filled by ``Capture.backward(objective)``.

    forward         -> <layer>/output        the module's output (first tensor of a tuple)
    forward_pre     -> <layer>/input         the module's first input (positional, or keyword)
    backward        -> <layer>/grad_output   d objective / d output
    backward_input  -> <layer>/grad_input    d objective / d first input
    attention       -> <layer>/attention     an attention module's post-softmax weights,
                                             (B, heads, queries, keys), from ``patterns``:
                                             the model family's (Family.patterns), which
                                             runs that module alone eager

A module that runs several times in one forward pass (resnet's shared ReLU) gives one value per
run: ``<layer>/output`` for the first, ``<layer>/output_1``, ``_2``, ... for later ones.

A batch that the model is called on several times, each call adding positions (generation: the
prompt, then one new position per call, with a key/value cache), is captured inside
``with capture.joined():``: each call's values are joined along their position axis, and
``take()`` makes the rows of the whole sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from types import MappingProxyType

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from probe.config.schema import HOOK_OF_KIND, Hook, Reduce, member
from probe.data.layouts import SAMPLE_ROWS, RowLayout
from probe.errors import ConfigError
from probe.families.base import first_tensor
from probe.file.format import Attr, call_key, dataset_key, parse_kind, split_key
from probe.pipeline.keys import KeyTransform, reduce_tensor
from probe.pipeline.modules import resolve_layers
from probe.pipeline.reduce import resolve_reduces

__all__ = ["attach", "Capture", "StopForward", "parse_hooks"]

# a family's source of attention patterns: (model, {module: layer}, on_pattern(layer,
# weights)) -> a context manager that yields the modules computing attention (Family.patterns)
Patterns = Callable[[nn.Module, Mapping[nn.Module, str], Callable[[str, torch.Tensor], None]],
                    AbstractContextManager]

_FLOAT16_LIMIT = 65520.0  # the smallest magnitude that float16 rounds to infinity


class StopForward(Exception):
    """Raised by the last hook a forward pass needs, once ``Capture.stop_early`` is armed: the
    layers after it would compute nothing that is stored. The runner catches it."""


def attach(model: nn.Module, layers: Iterable[str], hooks: Iterable[str | Hook] = ("forward",),
           *, reduce: str | Reduce = "none",
           reduce_by_layer: Mapping[str, str | Reduce] | None = None,
           dtype: torch.dtype | None = None) -> Capture:
    """Hooks on ``layers`` of ``model`` for the duration of a ``with`` block.

    Example::

        with probe.attach(model, ["features.28"]) as cap:
            model(inputs)
            conv_out = cap["features.28/output"]

    Args:
        model: the model; its mode and parameters are left as they are.
        layers: module names or globs, as in the ``layers`` config key.
        hooks: any of forward, forward_pre, backward, backward_input, attention (the
            model's family gives the patterns: Hugging Face models).
        reduce: none, mean, max (over the axes after the channel axis) or flatten.
        reduce_by_layer: exceptions to ``reduce``: {layer name or glob: reduce}; a layer's own
            name beats a glob, and globs that match one layer must agree.
        dtype: store copies in this dtype (None keeps the module's).

    Raises:
        ConfigError: an unknown layer, hook or reduce.
    """
    patterns = None
    if Hook.attention in parse_hooks(hooks):
        from probe.families.registry import family_for

        patterns = family_for(None, model).patterns
    return Capture(model, layers, hooks, reduce=reduce, reduce_by_layer=reduce_by_layer,
                   dtype=dtype, patterns=patterns)


def parse_hooks(hooks: Iterable[str | Hook]) -> list[Hook]:
    """Hook names (or members) as ``Hook`` members, in order, without repeats.

    Raises:
        ConfigError: an unknown name or an empty list.
    """
    parsed: list[Hook] = []
    for value in hooks:
        hook = member(Hook, value, f"hook {value!r}")
        if hook not in parsed:
            parsed.append(hook)
    if not parsed:
        raise ConfigError("hooks is empty; use e.g. 'hooks=[forward]'")
    return parsed


class Capture:
    """What hooked modules saw in the latest forward (and backward) pass.

    Example::

        with Capture(model, ["layer4"], ["forward", "backward"]) as cap:
            logits = model(inputs.requires_grad_())
            cap.backward(logits.amax(1).sum())
            act, grad = cap["layer4/output"], cap["layer4/grad_output"]
    """

    def __init__(self, model: nn.Module, layers: Iterable[str],
                 hooks: Iterable[str | Hook] = ("forward",), *, reduce: str | Reduce = "none",
                 reduce_by_layer: Mapping[str, str | Reduce] | None = None,
                 dtype: torch.dtype | None = None, stop_early: bool = False,
                 calls: Mapping[str, int] | None = None, patterns: Patterns | None = None):
        self.model = model
        # where attention patterns come from (hooks=[attention]): the family's
        self.patterns = patterns
        # the modules that computed attention in the latest pass, once patterns are asked
        self.attention_modules: dict[str, tuple[int, int, int]] = {}
        self._exits = ExitStack()
        self.layers = resolve_layers(model, layers)
        self.hooks = parse_hooks(hooks)
        # layer -> how its values are reduced
        self.reduces = resolve_reduces(self.layers, reduce, reduce_by_layer)
        self.dtype = dtype
        # How each key's captured tensor becomes its stored rows, by key (set by the planner,
        # from the dry run: probe.pipeline.keys); a key without one is reduced and cast. The
        # transforms pool positions as the batch's row layout says: `layout`, set before each
        # pass (probe.data.layouts).
        self.transforms: dict[str, KeyTransform] = {}
        self.layout: RowLayout = SAMPLE_ROWS
        # How often each hooked module runs in one forward pass: given (a dry run's count) or
        # learned from the first complete pass; every later pass must run them as often.
        self.calls: dict[str, int] | None = dict(calls) if calls is not None else None
        self._ran: dict[str, int] = {}  # "<layer>/<kind>" -> runs so far in this pass
        # forward-only: once the calls are known, raise StopForward as soon as a pass has given
        # its last value (see arm)
        self.stop_early = stop_early and not self.needs_grad
        self._armed = False
        # the CUDA devices whose device-to-host copies are in flight (a model spread over
        # several GPUs copies from each), and take()'s events for them
        self.copied: list[torch.cuda.Event] | None = None
        self._copying: set[torch.device] = set()
        # "<layer>/<kind>" -> position in the module's tuple output/input, where it was a tuple,
        # or the keyword of an input given by keyword
        self.tuple_positions: dict[str, int | str] = {}
        # float16 storage: whether a value overflowed float16 (checked once per pass, in take)
        self._overflow: list[torch.Tensor] = []
        self._values: dict[str, torch.Tensor] = {}
        # inside joined(): each key's values of the calls so far, as captured (None: outside);
        # after it, each key's joined value, which take() makes into rows
        self._joining: dict[str, list[torch.Tensor]] | None = None
        self._joined: dict[str, torch.Tensor] = {}
        self._edges: dict[str, GradientEdge] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    @property
    def keys(self) -> list[str]:
        """Every "<layer>/<kind>" this capture fills, layer by layer and run by run (before
        the calls are known, one run of each layer)."""
        calls = self.calls or {}
        return [call_key(layer, hook.kind, call) for layer in self.layers
                for call in range(calls.get(layer, 1)) for hook in self.hooks]

    @property
    def needs_grad(self) -> bool:
        return any(hook.needs_grad for hook in self.hooks)

    @property
    def wants_input_grad(self) -> bool:
        """Whether the graph must start at the model's input: a gradient at a module's input
        counts every path from that tensor, including paths that bypass the module."""
        return Hook.backward_input in self.hooks

    def attrs(self, key: str) -> dict:
        """What the file records about the dataset "<layer>/<kind>"."""
        layer, kind = split_key(key)
        kind, call = parse_kind(kind)
        transform = self.transforms.get(key)
        reduce = self.reduces[layer] if transform is None else transform.reduce
        attrs = {Attr.LAYER: layer, Attr.HOOK: HOOK_OF_KIND[kind].name, Attr.KIND: kind,
                 Attr.REDUCE: reduce.name}
        if (self.calls or {}).get(layer, 1) > 1:
            attrs[Attr.CALL] = call
        if self.dtype is not None:
            attrs[Attr.DTYPE] = str(self.dtype).removeprefix("torch.")
        where = self.tuple_positions.get(key)
        if where is not None:
            attrs[Attr.KEYWORD if isinstance(where, str) else Attr.TUPLE_POSITION] = where
        return attrs

    def arm(self) -> None:
        """Arm the early stop before the first pass, for a caller that gave the calls (from a
        complete pass, a dry run, in which every hooked module ran)."""
        if self.calls is None:
            raise RuntimeError("arm() needs the calls of every hooked module")
        self._armed = self.stop_early

    @contextmanager
    def joined(self) -> Iterator[None]:
        """For the block, the model is called several times on one batch, each call adding
        positions along the captured tensors' second axis (generation with a key/value cache):
        each call's values are kept as they were captured, on their device, and ``take()``
        joins them, then makes their rows by the ``layout`` set after the calls (the whole
        sequence's). No forward stops early: every call is the model's whole computation."""
        self._joining, self._armed = {}, False
        try:
            yield
        except BaseException:
            self._armed = self.stop_early
            raise
        else:  # take() makes the rows, unarmed, then arms the next pass
            self._joined = {key: parts[0] if len(parts) == 1 else torch.cat(parts, 1)
                            for key, parts in self._joining.items()}
        finally:
            self._joining = None

    @property
    def joined_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of each key's value that the last ``joined()`` block joined (until
        ``take()``)."""
        return {key: tuple(value.shape) for key, value in self._joined.items()}

    # -- lifetime -----------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        modules = dict(self.model.named_modules())
        try:
            if Hook.attention in self.hooks:
                if self.patterns is None:
                    raise ConfigError("hooks=[attention] needs a model whose family gives "
                                      "attention patterns (Hugging Face models); this one's "
                                      "does not")
                self.attention_modules = self._exits.enter_context(self.patterns(
                    self.model, {modules[layer]: layer for layer in self.layers},
                    self._on_pattern))
            # a new forward pass starts: forget the last one's values
            self._handles.append(self.model.register_forward_pre_hook(self._on_model_start))
            wants_pre = {Hook.forward_pre, Hook.backward_input, Hook.backward} & set(self.hooks)
            wants_post = {Hook.forward, Hook.backward} & set(self.hooks)
            for layer in self.layers:
                if wants_pre:  # with kwargs: some modules take their input by keyword (Llama's)
                    self._handles.append(modules[layer].register_forward_pre_hook(
                        lambda module, args, kwargs, layer=layer: self._on_input(layer, args,
                                                                                 kwargs),
                        with_kwargs=True))
                if wants_post:
                    self._handles.append(modules[layer].register_forward_hook(
                        lambda module, args, out, layer=layer: self._on_output(layer, out)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook, newest first, and drop references to the graph."""
        while self._handles:
            self._handles.pop().remove()
        self._exits.close()
        self._edges.clear()

    # -- reading ------------------------------------------------------------------------------

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"{key!r} was not captured; captured: {sorted(self._values)}") from None

    @property
    def values(self) -> Mapping[str, torch.Tensor]:
        """A read-only view of the latest values, by "<layer>/<kind>"."""
        return MappingProxyType(self._values)

    def take(self) -> dict[str, torch.Tensor]:
        """Hand over the latest values (every key, in ``keys`` order) and forget them.

        Raises:
            ConfigError: a hooked module did not run, or gradients were asked for but
                ``backward`` was not called.
        """
        joined, self._joined = self._joined, {}
        for key, value in joined.items():
            self._store(key, value)
        learned = self.calls is None
        if learned:  # the first complete pass tells how often each module runs
            self.calls = {layer: max([0, *(n for key, n in self._ran.items()
                                           if split_key(key)[0] == layer)])
                          for layer in self.layers}
        missing = [key for key in self.keys if key not in self._values]
        if missing or 0 in self.calls.values():
            idle = [layer for layer, n in self.calls.items() if n == 0]
            if learned:
                self.calls = None
            if Hook.attention in self.hooks:
                _check_attention_modules(self.layers, self.attention_modules)
            if idle:
                raise ConfigError(
                    f"nothing was captured for {', '.join(idle)}: the module did not run in the "
                    "forward pass; choose layers that the forward uses")
            raise ConfigError(
                f"nothing was captured for {', '.join(missing)}: the module ran fewer times "
                "than in the first pass (the runs of a module must be the same for every "
                "batch), or backward was not called")
        overflow, self._overflow = self._overflow, []
        if overflow and bool(torch.stack(overflow).any()):
            raise ConfigError(
                "a captured value lies beyond float16's range (+-65504) and would be stored as "
                "an infinity; use output.dtype=float32, or bfloat16"
            )
        values, self._values = {key: self._values[key] for key in self.keys}, {}
        # the next pass counts its runs from 0 even where the model is not called at its root
        # (a family that calls one of its methods), whose pre-hook also resets them
        self._ran.clear()
        self._armed = self.stop_early
        self.copied = None
        if self._copying:  # an event after the copies, on each device's queue of work
            self.copied = [torch.cuda.Event() for _ in self._copying]
            for event, device in zip(self.copied, self._copying, strict=True):
                event.record(torch.cuda.current_stream(device))
            self._copying = set()
        return values

    # -- gradients ----------------------------------------------------------------------------

    def backward(self, objective: torch.Tensor) -> None:
        """Differentiate the scalar ``objective`` with respect to the hooked tensors only.

        The gradients are taken at the graph edges recorded when each module ran, so an
        in-place op applied afterwards (a ReLU(inplace=True) on a conv's output) does not shift
        them: they are d objective / d the module's own output or input.

        Raises:
            ConfigError: the objective does not depend on a hooked layer.
        """
        keys = list(self._edges)
        if not keys:
            return
        if objective.requires_grad:
            grads = torch.autograd.grad(objective, [self._edges[key] for key in keys],
                                        allow_unused=True)
        else:  # no hooked tensor leads to it
            grads = [None] * len(keys)
        self._edges.clear()
        for key, grad in zip(keys, grads, strict=True):
            if grad is None:
                raise ConfigError(
                    f"the objective does not depend on {split_key(key)[0]!r}, so it has no "
                    "gradient there; choose a layer that lies between the input and the output"
                )
            self._keep(key, grad, None)

    # -- hooks --------------------------------------------------------------------------------

    def _on_model_start(self, module, args) -> None:
        self._values.clear()
        self._edges.clear()
        self._ran.clear()

    def _run(self, layer: str, kind: str) -> int:
        # which run of the module this is (from 0), for the hooks on its input or its output
        key = dataset_key(layer, kind)
        call = self._ran.get(key, 0)
        self._ran[key] = call + 1
        if self.calls is not None and call >= self.calls[layer]:
            raise ConfigError(
                f"layer {layer!r} ran more than {self.calls[layer]} time(s) in one forward pass, "
                "as often as in the first pass: the runs of a module must be the same for every "
                "batch"
            )
        return call

    def _on_input(self, layer: str, args: tuple, kwargs: dict):
        tensor, slot = first_tensor(args)
        if tensor is None:  # given by keyword: the first tensor among the keyword arguments
            slot = next((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), None)
            tensor = None if slot is None else kwargs[slot]
        if tensor is None:
            raise ConfigError(f"layer {layer!r} has no tensor input to capture; choose another")
        position = slot or None  # args is always a tuple: only a later slot is worth recording
        call = self._run(layer, "input")
        if Hook.forward_pre in self.hooks:
            self._keep(call_key(layer, "input", call), tensor, position)
        if Hook.backward_input in self.hooks:
            self._record_edge(call_key(layer, "grad_input", call), tensor, position)
        elif Hook.backward in self.hooks and torch.is_grad_enabled() and not tensor.requires_grad:
            # Start the graph here, not at the model's input: nothing upstream of a hooked
            # module is recorded. Only d/d outputs are asked for, and what lies downstream of
            # this module's output is unchanged. (The clone is not a leaf, so a module that
            # works in place on its input, like ReLU(inplace=True), still may.)
            start = tensor.detach().requires_grad_().clone()
            if isinstance(slot, str):
                return args, {**kwargs, slot: start}
            return (*args[:slot], start, *args[slot + 1:]), kwargs
        return None

    def _on_output(self, layer: str, output) -> None:
        tensor, position = self._tensor_of(layer, output, "output")
        call = self._run(layer, "output")
        if Hook.forward in self.hooks:
            self._keep(call_key(layer, "output", call), tensor, position)
        if Hook.backward in self.hooks:
            self._record_edge(call_key(layer, "grad_output", call), tensor, position)

    def _on_pattern(self, layer: str, weights: torch.Tensor) -> None:
        self._keep(call_key(layer, Hook.attention.kind, self._run(layer, Hook.attention.kind)),
                   weights, None)

    def _tensor_of(self, layer: str, value, what: str) -> tuple[torch.Tensor, int | None]:
        tensor, position = first_tensor(value)
        if tensor is None:
            raise ConfigError(f"layer {layer!r} has no tensor {what} to capture; choose another")
        return tensor, position

    def _keep(self, key: str, tensor: torch.Tensor, position: int | str | None) -> None:
        if position is not None:
            self.tuple_positions[key] = position
        if self._joining is not None:  # a copy: a later in-place op cannot reach it
            self._joining.setdefault(key, []).append(tensor.detach().clone())
            return
        self._store(key, tensor.detach())

    def _store(self, key: str, value: torch.Tensor) -> None:
        # the key's rows, cast and copied to the CPU
        transform = self.transforms.get(key)
        if transform is not None:
            value = transform(value, self.layout)
        else:
            value = reduce_tensor(value, self.reduces[split_key(key)[0]])
        dtype = self.dtype or value.dtype
        if dtype == torch.float16 and value.dtype != torch.float16:
            self._overflow.append((value.abs() >= _FLOAT16_LIMIT).any())  # NaN stays NaN
        if value.device.type == "cuda":
            # enqueued now, so it reads the value before any later in-place op on the device
            host = torch.empty(value.shape, dtype=dtype, pin_memory=True)
            self._values[key] = host.copy_(value.to(dtype), non_blocking=True)
            self._copying.add(value.device)
        else:
            # A copy, so that a later in-place op cannot reach what is stored; except for the
            # last value of a pass that stops right after it, which nothing can change.
            last = self._armed and len(self._values) == len(self.keys) - 1
            self._values[key] = value.to("cpu", dtype, copy=not last)
        if self._armed and len(self._values) == len(self.keys):
            raise StopForward

    def _record_edge(self, key: str, tensor: torch.Tensor, position: int | str | None) -> None:
        if not tensor.requires_grad:
            raise ConfigError(
                f"layer {split_key(key)[0]!r}: its {_what(key)} does not depend "
                "on the input, so it has no gradient; choose a layer that the input flows through"
            )
        if position is not None:
            self.tuple_positions[key] = position
        self._edges[key] = get_gradient_edge(tensor)


def _check_attention_modules(layers: list[str], found: Mapping[str, tuple]) -> None:
    """Refuse hooked layers that computed no attention, naming those that did."""
    other = [layer for layer in layers if layer not in found]
    if other:
        named = ", ".join(found) or "none"
        raise ConfigError(f"{other[0]} is not an attention module (it computes no attention "
                          f"weights), so hooks=[attention] has no pattern there; this model's "
                          f"attention modules: {named}")


def _what(key: str) -> str:
    # "input" or "output", for a message about "<layer>/grad_input_1"
    return parse_kind(split_key(key)[1])[0].removeprefix("grad_")
