"""A writer thread between the compute loop and the store, fed through a bounded queue.

The loop hands over each batch and goes on computing while the previous one is written, so a
run takes about max(compute, write) rather than their sum; the queue bound keeps memory flat.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from probe.store import Store

__all__ = ["BackgroundWriter"]

log = logging.getLogger(__name__)

_STOP = object()


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
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except BaseException as err:  # the block's own error is the one to report
            log.debug("writer stopped with %r", err)

    def put(self, index, target, values, ready=None, lengths=None) -> None:
        """Queue one batch; blocks while ``max_pending`` batches wait. Raises a write error.

        ``ready`` is a CUDA event that completes when the device-to-host copies of ``values``
        have landed (None for values already on the host); ``lengths`` are the token rows of
        each sample, for a run with rows per token."""
        item = (index, target, values, ready, lengths)
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
            raise self._error

    def _work(self) -> None:
        batches, last_commit = 0, time.monotonic()
        try:
            while (item := self._queue.get()) is not _STOP:
                index, target, values, ready, lengths = item
                if ready is not None:
                    ready.synchronize()
                self.store.append(index, target, values, lengths)
                batches += 1
                if (batches % self._commit_batches == 0
                        or time.monotonic() - last_commit >= self._commit_seconds):
                    self.store.commit()
                    last_commit = time.monotonic()
            self.store.commit()
        except BaseException as err:  # handed to the compute thread, which raises it
            self._error = err
            # keep taking items so a blocked put() sees the error instead of waiting forever
            while self._queue.get() is not _STOP:
                pass
