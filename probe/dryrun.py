"""The dry run: one sample through the model, forward only, with hooks of its own, before any
file exists.

It finds what every stored dataset will hold (``DatasetSpec``: row shape, type, attrs), which
captured tensors are token layouts (their leading axes follow the batch's tokens), layers that do
not run or run more than once, and a model that fails on the data, which it reports in one line
naming the module.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from probe.config import Tokens
from probe.errors import ConfigError, ProbeError
from probe.feed import Batch, Objective
from probe.format import Attr, DatasetSpec, dataset_key, split_key
from probe.hooks import Capture, reduce_tensor

__all__ = ["dry_run"]

# the forward hook whose value has the shape of each kind (gradients have their tensor's shape)
_SHAPE_SOURCE = {"output": "forward", "grad_output": "forward", "input": "forward_pre",
                 "grad_input": "forward_pre"}


def dry_run(capture: Capture, feed, batches: list[Batch], device: torch.device,
            objective: Objective | None = None) -> dict[str, DatasetSpec]:
    """The spec of every dataset ``capture`` fills, from ``batches`` (one sample each; a feed
    of token sequences gives two, the second one position longer). Sets ``capture.token_keys``
    to the keys whose tensors have (batch, sequence) leading axes. ``objective``, for a
    gradient run, is checked on the model's output.

    Raises:
        ConfigError: a layer that does not run or runs twice, a model that fails on the
            sample (naming the module), an objective that does not fit the output.
    """
    kinds = sorted({_SHAPE_SOURCE[hook.kind] for hook in capture.hooks})
    shapes: list[dict[str, tuple[int, ...]]] = []
    for batch in batches:
        dry = Capture(capture.model, capture.layers, kinds, dtype=capture.dtype)
        batch = batch.to(device)
        with dry, torch.inference_mode():
            output = _forward(feed, capture.model, batch)
            if objective is not None:
                objective(output, batch)
            shapes.append({key: tuple(value.shape) for key, value in dry.take().items()})
    if feed.token_rows:  # a token layout grows with the batch's padded length
        lengths = [batch.keep.shape[1] for batch in batches]
        sources = {key for key in shapes[0] if all(
            len(s[key]) > 1 and s[key][1] == n for s, n in zip(shapes, lengths, strict=True))}
    else:
        sources = set()
    specs: dict[str, DatasetSpec] = {}
    for key in capture.keys:
        layer, kind = split_key(key)
        source = dataset_key(layer, kind.removeprefix("grad_"))
        if source in sources:
            capture.token_keys.add(key)
        per_token = source in sources and capture.tokens is Tokens.all
        raw = shapes[0][source]
        rows = torch.empty((1, *raw[2:]) if source in sources else raw, device="meta")
        attrs = capture.attrs(key)
        if source in dry.tuple_positions:
            where = dry.tuple_positions[source]
            attrs[Attr.KEYWORD if isinstance(where, str) else Attr.TUPLE_POSITION] = where
        specs[key] = DatasetSpec(tuple(reduce_tensor(rows, capture.reduces[layer]).shape[1:]),
                                 str(capture.dtype).removeprefix("torch."), attrs,
                                 per_token=per_token)
    return specs


def _forward(feed, model: nn.Module, batch: Batch):
    with _failing_module(model) as running:
        try:
            return feed.forward(model, batch)
        except ProbeError:
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
