"""The dry run: one sample through the model, forward only, with hooks of its own, before any
file exists.

It finds the shape of every captured tensor, how often each hooked module runs per forward
pass, where each value sat in a module's tuple, which values follow the batch's row layout
(probe.data.layouts: the axis their capture kind runs along positions is the layout's
positions in every dry batch), layers that do not run, and a model that fails on the data,
which it reports in one line naming the module.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field

import torch
from torch import nn

from probe.data.feed import Batch
from probe.data.layouts import SAMPLE_ROWS, Axes, RowLayout
from probe.errors import ConfigError, ProbeError
from probe.file.format import parse_kind, split_key
from probe.pipeline.hooks import Capture, StopForward

__all__ = ["DryRun", "dry_run"]


@dataclass
class DryRun:
    """What one sample showed about each key the capture fills."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # batch axis first
    axes: dict[str, Axes] = field(default_factory=dict)  # as each key's capture kind says
    follows: set[str] = field(default_factory=set)  # keys whose values follow the layout
    layout: RowLayout = SAMPLE_ROWS  # the first dry batch's row layout
    calls: dict[str, int] = field(default_factory=dict)  # runs of each module per pass
    where: dict[str, int | str] = field(default_factory=dict)  # tuple positions, keywords

    @property
    def plain(self) -> list[str]:
        """The keys that follow no layout: stored a row per sample."""
        return [key for key in self.shapes if key not in self.follows]


def dry_run(capture: Capture, family, feed, batches: list[Batch], device: torch.device,
            objective=None, around: Callable[[Batch], AbstractContextManager] | None = None
            ) -> DryRun:
    """The raw shape of every key ``capture`` fills, from ``batches`` (one sample each; a feed
    of sequences gives two of different lengths), and what the capture is to be armed with.
    ``objective``, for a gradient run, is checked on the model's output; ``around`` gives
    what the model computes each batch under (the run's interventions).

    Raises:
        ConfigError: a layer that does not run, a model that fails on the sample (naming the
            module), an objective that does not fit the output.
    """
    shapes: list[dict[str, tuple[int, ...]]] = []
    layouts: list[RowLayout] = []
    found = DryRun()
    for n, batch in enumerate(batches):
        # The first pass runs the whole model and counts how often each hooked module runs;
        # later ones only need the hooked modules' shapes.
        dry = Capture(capture.model, capture.paths, capture.kinds, dtype=capture.dtype,
                      stop_early=n > 0, family=family, dry=True)
        if n > 0:
            dry.arm(found.calls, found.where)
        on_device = batch.to(device)
        layouts.append(family.layout(capture.model, on_device))
        if n == 0:  # what the layout cannot store says so before the model fails on it
            layouts[0].check([], gradients=objective is not None)
        with dry, (around or nullcontext)(on_device), torch.inference_mode(), \
                suppress(StopForward):
            output = _forward(family, feed, capture.model, on_device)
            if objective is not None and n == 0:
                objective(output, on_device)
        shapes.append({key: tuple(value.shape) for key, value in dry.take().items()})
        if n == 0:
            found.calls, found.where, keys = dict(dry.calls), dict(dry.where), dry.keys
    found.layout = layouts[0]
    kinds = {kind.kind: kind for kind in capture.kinds}
    for key in keys:
        found.shapes[key] = shapes[0][key]
        found.axes[key] = axes = kinds[parse_kind(split_key(key)[1])[0]].axes
        # an axis that follows the layout in every dry batch (whose lengths differ) is its own
        if all(layout.follows(key, s[key], axes) for s, layout in zip(shapes, layouts,
                                                                       strict=True)):
            found.follows.add(key)
        elif len(seen := list(dict.fromkeys(s[key][1:] for s in shapes))) > 1:
            # rows per sample whose shape changes with the sample: the store cannot hold them
            raise ConfigError(
                f"{key} is {seen[0]} for one sample and {seen[1]} for another: it varies with "
                "the sample "
                "but has no feature axis to store a row per position (token ids, say); hook a "
                "module whose value is (batch, position, features), such as its output")
    return found


def _forward(family, feed, model: nn.Module, batch: Batch):
    with _failing_module(model) as running:
        try:
            return family.forward(model, batch)
        except (ProbeError, StopForward):
            raise
        except Exception as err:  # the model's own error: say where, in one line
            name = running[-1] if running else "the model"
            kind = type(dict(model.named_modules())[name]).__name__ if running else ""
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            what = (f"one sample of {feed.describe(batch)}" if len(batch) == 1 else
                    f"a padded batch of {len(batch)} samples of {feed.describe(batch)}")
            raise ConfigError(
                f"the model fails on {what} in {name}{f' ({kind})' if kind else ''}: {reason}; "
                f"check that the inputs suit the model ({feed.hint})"
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
