"""The dry run: one sample through the model, forward only, with hooks of its own, before any
file exists.

It finds what every stored dataset will hold (``DatasetSpec``: row shape, type, attrs), how often
each hooked module runs per forward pass, which captured tensors are token layouts, layers that
do not run, and a model that fails on the data, which it reports in one line naming the module.
"""

from __future__ import annotations

from contextlib import contextmanager, suppress

import torch
from torch import nn

from probe.config import Reduce, Tokens
from probe.errors import ConfigError, ProbeError
from probe.feed import Batch, Objective
from probe.format import Attr, DatasetSpec, call_key, parse_kind, split_key
from probe.hooks import Capture, StopForward
from probe.reduce import reduce_tensor
from probe.tokens import is_vision_transformer

__all__ = ["dry_run"]

# the forward hook whose value has the shape of each kind (gradients have their tensor's shape)
_SHAPE_SOURCE = {"output": "forward", "grad_output": "forward", "input": "forward_pre",
                 "grad_input": "forward_pre"}


def dry_run(capture: Capture, feed, batches: list[Batch], device: torch.device,
            objective: Objective | None = None) -> dict[str, DatasetSpec]:
    """The spec of every dataset ``capture`` fills, from ``batches`` (one sample each; a feed
    of token sequences gives two of different lengths). Sets ``capture.calls`` (how often each
    hooked module runs per forward pass) and ``capture.token_keys`` (the keys whose tensors
    have (batch, token) leading axes). ``objective``, for a gradient run, is checked on the
    model's output.

    Raises:
        ConfigError: a layer that does not run, a model that fails on the sample (naming the
            module), an objective that does not fit the output, a reduce that would pool a
            token layout's features.
    """
    kinds = sorted({_SHAPE_SOURCE[hook.kind] for hook in capture.hooks})
    shapes: list[dict[str, tuple[int, ...]]] = []
    for n, batch in enumerate(batches):
        # The first pass runs the whole model and counts how often each hooked module runs;
        # later ones only need the hooked modules' shapes.
        dry = Capture(capture.model, capture.layers, kinds, dtype=capture.dtype,
                      stop_early=n > 0, calls=capture.calls if n > 0 else None)
        if n > 0:
            dry.arm()
        batch = batch.to(device)
        with dry, torch.inference_mode(), suppress(StopForward):
            output = _forward(feed, capture.model, batch)
            if objective is not None and n == 0:
                objective(output, batch)
        shapes.append({key: tuple(value.shape) for key, value in dry.take().items()})
        if n == 0:
            capture.calls = dry.calls
            positions = dict(dry.tuple_positions)
    sources = _token_layouts(capture, feed, batches, shapes)
    specs: dict[str, DatasetSpec] = {}
    for key in capture.keys:
        layer, kind = split_key(key)
        kind, call = parse_kind(kind)
        source = call_key(layer, kind.removeprefix("grad_"), call)
        if source in sources:
            capture.token_keys.add(key)
        # a token layout loses its token axis: it gives rows per token (token sequences with
        # tokens=all), or one row per sample (first, last, mean); a vision transformer's with
        # tokens=all keeps its (tokens, features) rows
        pooled = source in sources and (feed.token_rows or capture.tokens is not Tokens.all)
        per_token = source in sources and feed.token_rows and capture.tokens is Tokens.all
        if source in sources and not pooled:
            _refuse_feature_reduce(key, capture.reduces[layer])
        raw = shapes[0][source]
        rows = torch.empty((1, *raw[2:]) if pooled else raw, device="meta")
        attrs = capture.attrs(key)
        where = positions.get(source)
        if where is not None:
            attrs[Attr.KEYWORD if isinstance(where, str) else Attr.TUPLE_POSITION] = where
        specs[key] = DatasetSpec(tuple(reduce_tensor(rows, capture.reduces[layer]).shape[1:]),
                                 str(capture.dtype).removeprefix("torch."), attrs,
                                 per_token=per_token)
    return specs


def _token_layouts(capture: Capture, feed, batches: list[Batch],
                   shapes: list[dict[str, tuple[int, ...]]]) -> set[str]:
    """The captured keys whose tensors have (batch, token) leading axes: for token sequences,
    those whose second axis follows the batch's length; for images, the 3-D outputs in a
    vision transformer (timm's and torchvision's)."""
    if feed.token_rows:
        lengths = [batch.keep.shape[1] for batch in batches]
        return {key for key in shapes[0] if all(
            len(s[key]) > 1 and s[key][1] == n for s, n in zip(shapes, lengths, strict=True))}
    if is_vision_transformer(capture.model):
        return {key for key, shape in shapes[0].items() if len(shape) == 3}
    return set()


def _refuse_feature_reduce(key: str, how: Reduce) -> None:
    # the axes after a token layout's "channel" axis are its features, not space
    if how in (Reduce.mean, Reduce.max):
        raise ConfigError(
            f"reduce={how.name} on {key}, a token layout (N, tokens, features): it would "
            f"{how.name}-pool the feature axis; pool the tokens instead with tokens=first "
            "(the class token), last or mean, or leave this layer out of the reduce "
            f"('reduce_by_layer={{{split_key(key)[0]}:none}}')"
        )


def _forward(feed, model: nn.Module, batch: Batch):
    with _failing_module(model) as running:
        try:
            return feed.forward(model, batch)
        except (ProbeError, StopForward):
            raise
        except Exception as err:  # the model's own error: say where, in one line
            name = running[-1] if running else "the model"
            kind = type(dict(model.named_modules())[name]).__name__ if running else ""
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(
                f"the model fails on one sample of {feed.describe(batch)} in {name}"
                f"{f' ({kind})' if kind else ''}: {reason}; check that the inputs suit the "
                f"model ({feed.hint})"
            ) from None


@contextmanager
def _failing_module(model: nn.Module):
    """The names of the modules running right now, innermost last: after an exception in the
    forward pass, the module that raised it is the last one."""
    running: list[str] = []

    def enter(name: str) -> None:
        running.append(name)

    def leave() -> None:  # returns None: a forward hook's result would replace the output
        running.pop()

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(lambda *_, n=name: enter(n)))
            handles.append(module.register_forward_hook(lambda *_: leave()))
    try:
        yield running
    finally:
        for handle in reversed(handles):
            handle.remove()
