"""The rows of one batch, made as the hooks hand its values over (``BatchRows``): what a pass
owns for one batch, where the hook object (probe.pipeline.hooks) only hooks and copies.

For each key, the captured value becomes its stored rows at hook time, by the key's transform
and the batch's row layout (probe.pipeline.keys), is made into what its datasets store (cast,
projected, encoded: probe.pipeline.compact) and copied off the compute path: to the CPU, or,
from a GPU, into pinned memory by a copy that the GPU enqueues at once (so that a later
in-place op cannot reach it); ``take()`` then records an event after the copies on each
device, which the writer waits for (``ready``). A value the stored type cannot hold (beyond
float16's range, a NaN in a float8 row) is found in ``take()``.

Where the model is called several times on one batch, each call adding positions (a
generation, with a key/value cache), the rows are ``joined``: each call's values are kept
as captured, on their device, and ``take(layout)`` joins them along their position axis
and makes the rows of the whole sequence by the layout known once the calls are done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from probe.data.layouts import POSITIONS_FIRST, Axes, RowLayout
from probe.pipeline.compact import Compact

__all__ = ["BatchRows", "Computed", "StopForward", "Rows"]

# the stored rows of a key's value in a batch of a layout: (key, value, layout) -> rows
Rows = Callable[[str, torch.Tensor, RowLayout], torch.Tensor]


@dataclass(frozen=True)
class Computed:
    """A batch as computed: its rows to store (every key's, its layout's bookkeeping per
    position, and its rows per sample), the rows each sample has where they are one per
    position, by the dataset that bounds them (its layout's ``bounded_lengths``), and the
    events after which the rows' copies from a GPU are done (None: nothing to wait for)."""

    rows: dict
    lengths: Mapping[str, torch.Tensor] | None = None
    ready: list | None = None


class StopForward(Exception):
    """Raised by the last hook a forward pass needs, once the early stop is armed: the layers
    after it would compute nothing that is stored. The pass catches it."""


class BatchRows:
    """The stored rows of one batch (see the module's docstring).

    ``rows_of`` makes a key's rows; ``compact`` what its datasets store of them;
    ``layout`` is the batch's (None: the rows are joined, and ``take`` gets the layout);
    ``axes``: those of each key that follows the batch's positions (joined along them);
    ``stop_after``: how many values a forward pass gives, after the last of which it stops
    (None: it runs to its end).
    """

    def __init__(self, rows_of: Rows, compact: Compact, layout: RowLayout | None,
                 *, axes: Mapping[str, Axes] | None = None, stop_after: int | None = None):
        self._rows_of, self._compact, self._layout = rows_of, compact, layout
        self._axes = axes or {}
        self._stop_after = stop_after if layout is not None else None
        # the rows so far, by dataset: each key's, and any beside it (a float8 row's scale)
        self.values: dict[str, torch.Tensor] = {}
        self._datasets: dict[str, list[str]] = {}  # key -> the datasets of its rows
        self._parts: dict[str, list[torch.Tensor]] = {}  # joined: each call's values
        self._devices: set[torch.device] = set()  # GPUs whose copies are in flight
        self.ready: list[torch.cuda.Event] | None = None  # set by take()

    @property
    def keys(self) -> set[str]:
        """The keys given a value so far."""
        return set(self._datasets) | set(self._parts)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each joined key's shape, its calls joined (before ``take``)."""
        return {key: tuple(self._joined(key, parts).shape) for key, parts in self._parts.items()}

    def add(self, key: str, value: torch.Tensor) -> None:
        """The value of ``key`` that a hook captured (this call's, for joined rows).

        Raises:
            StopForward: it was the last value the pass needs.
        """
        if self._layout is None:  # a copy: a later in-place op cannot reach it
            self._parts.setdefault(key, []).append(value.detach().clone())
            return
        self._store(key, value.detach(), self._layout)

    def restart(self) -> None:
        """A new forward pass begins: its values replace the last one's (joined rows keep
        every call's)."""
        if self._layout is not None:
            self.values.clear()
            self._datasets.clear()

    def take(self, layout: RowLayout | None = None, order: list[str] | None = None
             ) -> dict[str, torch.Tensor]:
        """The rows of every key (in ``order``, where given), once joined rows are made by
        ``layout`` (each key's datasets: its own, then any beside it); ``ready`` holds the
        events after the copies from each GPU.

        Raises:
            ConfigError: a value the stored type cannot hold (beyond float16's range, NaN in a
                float8 row).
        """
        parts, self._parts = self._parts, {}
        for key, values in parts.items():
            self._store(key, self._joined(key, values), layout)
        self._compact.check()
        if self._devices:  # an event after the copies, on each device's queue of work
            self.ready = [torch.cuda.Event() for _ in self._devices]
            for event, device in zip(self.ready, self._devices, strict=True):
                event.record(torch.cuda.current_stream(device))
            self._devices = set()
        keys = self._datasets if order is None else order
        return {name: self.values[name] for key in keys for name in self._datasets[key]}

    def mismatched(self, layout: RowLayout) -> dict[str, int]:
        """The joined keys that follow the batch's positions but whose positions ``layout``
        does not fit (a module that saw fewer positions than the model was fed), with the
        positions each saw."""
        found = {}
        for key, shape in self.shapes.items():
            axes = self._axes.get(key)
            if axes is not None and not layout.follows(key, shape, axes):
                found[key] = shape[1 + axes.position]
        return found

    def _joined(self, key: str, parts: list[torch.Tensor]) -> torch.Tensor:
        # each call added positions along the value's position axis; a value that follows no
        # positions comes from one call (a vision tower runs on the prompt's images only)
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts, 1 + self._axes.get(key, POSITIONS_FIRST).position)

    def _store(self, key: str, value: torch.Tensor, layout: RowLayout) -> None:
        # the key's rows, made into its datasets' values and copied off the compute path
        parts = self._compact.encode(key, self._rows_of(key, value, layout))
        last = self._stop_after is not None and len(self._datasets) == self._stop_after - 1
        for name, part in parts.items():
            if part.device.type == "cuda":
                # enqueued now, so it reads the value before any later in-place op on the device
                host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
                self.values[name] = host.copy_(part, non_blocking=True)
                self._devices.add(part.device)
            else:
                # A copy where the rows still share the captured tensor's memory, so that a
                # later in-place op cannot reach what is stored; rows made anew (the real
                # tokens of a padded batch, a pooled row) are stored as they are. Nor is the
                # last value of a pass that stops right after it copied: nothing can change it.
                shared = part.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
                self.values[name] = part.to("cpu", copy=shared and not last)
        self._datasets[key] = list(parts)
        if self._stop_after is not None and len(self._datasets) == self._stop_after:
            raise StopForward
