"""A writer thread between the compute loop and the store, fed through a bounded queue.

The loop hands over each batch and goes on computing while the previous one is written, so a
run takes about max(compute, write) rather than their sum; the queue bound keeps memory flat.
Batches that end no group (length-bucketed batches, probe.data.buckets) wait here until their
group is complete, and its rows go to the store in dataset order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping

import numpy as np

from probe.file.format import DEFAULT_BOUNDS
from probe.file.store import Store, as_array, close_after

__all__ = ["BackgroundWriter", "WriteFailed"]

log = logging.getLogger(__name__)

_STOP = object()


class WriteFailed(Exception):
    """The writer thread's error (its ``__cause__``), raised in the thread that feeds it."""


class BackgroundWriter:
    """Appends batches to a ``Store`` on a thread; commits every few batches or seconds.

    Example::

        with BackgroundWriter(store) as writer:
            for batch in batches:
                writer.put(index, target, values)
            writer.close()      # drains the queue, commits, re-raises a write error

    Leaving the block on an error still writes and commits the batches already handed over
    (a resumed run continues after them); an error of the writer itself is then only logged.
    """

    def __init__(self, store: Store, *, max_pending: int = 4, commit_every_batches: int = 8,
                 commit_every_seconds: float = 5.0):
        self.store = store
        self._commit_batches, self._commit_seconds = commit_every_batches, commit_every_seconds
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="probe-writer", daemon=True)
        self._thread.start()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        close_after(self.close, exc_type is not None, "the writer")

    def put(self, index, target, values, ready=None, lengths=None, ends_group: bool = True,
            skipped=()) -> None:
        """Queue one batch; blocks while ``max_pending`` batches wait. Raises a write error.

        ``ready`` are CUDA events that complete when the device-to-host copies of ``values``
        have landed (None for values already on the host); ``lengths`` are the position rows
        of each sample, for a run with rows per position; a batch that does not end its group
        is held until one that does; ``skipped`` are dataset indices left out of it."""
        item = (index, target, values, lengths, list(skipped), ready, ends_group)
        while True:
            self._raise_if_failed()
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Write every queued batch, commit, stop the thread; raise the error it met, if any."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise WriteFailed(str(self._error)) from self._error

    def _work(self) -> None:
        batches, last_commit, group = 0, time.monotonic(), []
        item = None
        try:
            while (item := self._queue.get()) is not _STOP:
                *part, skipped, ready, ends_group = item
                for event in ready or ():
                    event.synchronize()
                group.append((part, skipped))
                if not ends_group:
                    continue
                # a batch whose samples were all left out has no values: it adds nothing
                parts = [p for p, _ in group if len(p[0])] or [group[0][0]]
                in_order = len(parts) == 1 and bool((np.diff(np.asarray(parts[0][0])) > 0).all())
                self.store.append(*(parts[0] if in_order else
                                    in_dataset_order(parts, self.store.per_position_keys)),
                                  skipped=sorted(i for _, s in group for i in s))
                group = []
                batches += 1
                if (batches % self._commit_batches == 0
                        or time.monotonic() - last_commit >= self._commit_seconds):
                    self.store.commit()
                    last_commit = time.monotonic()
            self.store.commit()
        except BaseException as err:  # handed to the compute thread, which raises it
            self._error = err
            # keep taking items so a blocked put() sees the error instead of waiting forever
            while item is not _STOP:
                item = self._queue.get()


def in_dataset_order(parts: list, per_position: Mapping[str, str]) -> tuple:
    """Batches ``(index, target, values, lengths)`` joined into one, rows in the order of their
    index (dataset order); a sample's rows per position move as one block. ``per_position``:
    the datasets of rows per position, each with the dataset that bounds them (the key of its
    lengths, where ``lengths`` are given per bounds)."""
    index = np.concatenate([np.asarray(p[0]) for p in parts])
    order = np.argsort(index, kind="stable")
    target = (None if parts[0][1] is None else
              np.concatenate([np.asarray(p[1]) for p in parts])[order])
    lengths = parts[0][3]
    if lengths is not None and not isinstance(lengths, Mapping):
        parts = [(*p[:3], {DEFAULT_BOUNDS: p[3]}) for p in parts]
    lengths = (None if lengths is None else
               {name: np.concatenate([np.asarray(p[3][name]) for p in parts])
                for name in parts[0][3]})
    rows = {name: _moved_rows(counts, order) for name, counts in (lengths or {}).items()}
    values = {}
    for key in parts[0][2]:
        joined = np.concatenate([as_array(p[2][key]) for p in parts])
        values[key] = joined[rows[per_position[key]]] if key in per_position else joined[order]
    return (index[order], target, values,
            None if lengths is None else {name: counts[order] for name, counts in lengths.items()})


def _moved_rows(lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Where each sample's block of rows goes when the samples take ``order``."""
    starts = np.cumsum(lengths) - lengths
    moved = lengths[order]
    return np.arange(int(moved.sum())) + np.repeat(starts[order] - (np.cumsum(moved) - moved),
                                                    moved)
