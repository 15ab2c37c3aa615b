"""The runner: from a composed config to a finished HDF5 file.

``run(cfg)`` is ``execute(plan(cfg))``: the plan decides everything that can fail before a file
exists (probe.pipeline.plan); the execution feeds each batch's captures to a writer thread and the
store. The hooks are removed whether the run ends or fails.
"""

from __future__ import annotations

import errno
import logging
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig
from tqdm import tqdm

from probe.errors import OutputError, RunStopped
from probe.file.encodings import fidelity_words
from probe.file.sizes import human_bytes
from probe.file.store import Store
from probe.file.writer import BackgroundWriter, WriteFailed
from probe.pipeline.batch_rows import Computed
from probe.pipeline.modules import frozen_parameters
from probe.pipeline.plan import Plan, plan

__all__ = ["run", "execute", "StopRequest"]

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> Path:
    """Run the pipeline that ``cfg`` describes; return the path of the finished file.

    Re-running a config whose file is complete does nothing; a run stopped part-way (a crash,
    SIGKILL, SIGINT, SIGTERM) resumes after its last committed rows.

    Raises:
        ProbeError: a config value, file or device that cannot work (nothing is written), or
            ``RunStopped`` when a signal stopped the run (the committed rows are kept).
    """
    return execute(plan(cfg))


class StopRequest:
    """A request to stop at the next batch boundary: set by SIGINT or SIGTERM while a run
    executes (or SIGUSR2, where a job scheduler's handler waits for it), or by a caller that
    wants a run to stop (``signum`` names the reason). ``hand_on`` is the handler that had the
    signal before the run: it gets the signal once the run has stopped and committed."""

    def __init__(self, signum: int | None = None):
        self.signum = signum
        self.hand_on = None

    def __bool__(self) -> bool:
        return self.signum is not None


def execute(plan: Plan, *, stop: StopRequest | None = None) -> Path:
    """Carry out a plan: write every remaining row into the store; return the file's path.

    Raises:
        RunStopped: SIGINT, SIGTERM or ``stop`` ended the run at a batch boundary; the rows
            written so far are committed.
    """
    if plan.done:
        found = plan.output.found
        return plan.path if found.path == plan.path else plan.output.rename_finished()
    with plan.output.writing() as as_found:
        if not as_found:  # another run finished it meanwhile
            return plan.path
        return _write(plan, stop if stop is not None else StopRequest())


def _write(plan: Plan, stop: StopRequest) -> Path:
    out, capture = plan.config.output, plan.capture
    started = time.perf_counter()
    loader = plan.feed.loader(plan.dataset, plan.selection[plan.resume_from:], plan.batching)
    store = None
    try:
        # signals stop the run from here on, at the next batch boundary (or before the first)
        with _stop_signals(stop):
            store = Store(plan.path, config_yaml=plan.config_yaml,
                          num_rows=plan.num_rows, datasets=plan.datasets,
                          has_target=plan.has_target, per_position=plan.per_position,
                          num_positions=plan.num_positions,
                          most_rows=plan.most_rows,
                          most_positions=plan.most_positions, resume_from=plan.resume_rows,
                          resume_skipped=plan.resume_skipped, filters=plan.filters,
                          attrs=plan.attrs, transforms=plan.transforms,
                          locking=plan.output.locking)
            with store, BackgroundWriter(store, commit_every_batches=out.commit_every,
                                         commit_every_seconds=out.commit_seconds) as writer:
                with capture, frozen_parameters(plan.model, capture.needs_grad):
                    units = _loop(plan, loader, writer, stop)
                writer.close()
                fidelity = capture.compact.report()
                store.describe(fidelity)
                store.finish()
    except _Stopped:
        of = "" if plan.num_rows is None else f" of {plan.num_rows}"
        saved = (f"with {store.num_committed}{of} rows saved in {store.partial}; run the same "
                 "command again to resume" if store is not None and store.partial.exists() else
                 "before any rows were saved; run the same command again to start")
        message = f"stopped by {signal.Signals(stop.signum).name} {saved}"
        if stop.hand_on is not None:  # a scheduler's handler: it requeues the job, or says why not
            log.warning("%s", message)
            try:
                stop.hand_on(stop.signum, None)
            except Exception as err:  # not requeued (out of time limits): the scheduler's error
                log.warning("the job was not requeued (%s); launch the same command again to "
                            "resume after the %d rows saved", err, store.num_committed)
                raise
        raise RunStopped(message, exit_code=128 + int(stop.signum)) from None
    except (OSError, RuntimeError, WriteFailed) as err:
        if _disk_full(err):
            raise _disk_full_error(plan, store) from None
        if not isinstance(err, WriteFailed):
            raise
        raise _write_error(plan, store, err.__cause__) from None
    seconds = time.perf_counter() - started
    log.info("wrote %d rows (%s) in %.1f s: %.3g %s/s, %s/s, to %s",
             store.num_written - plan.resume_rows, human_bytes(store.bytes_written), seconds,
             units / seconds, plan.feed.unit, human_bytes(store.bytes_written / seconds),
             plan.path)
    for key, said in fidelity.items():
        log.info("%s as stored, %s", key, fidelity_words(said))
    summary = plan.compute.summary()
    if summary:
        log.info("%s", summary)
    return plan.path


def _disk_full(err: BaseException | None) -> bool:
    """Whether ``err``, or an error that led to it, says that the disk is full."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "errno = 28," in str(err) or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _write_error(plan: Plan, store: Store, err: BaseException) -> OutputError:
    said = (str(err).strip().splitlines() or [""])[0]
    return OutputError(f"writing {str(store.partial)!r} failed ({type(err).__name__}: {said}): "
                       f"{store.num_committed} rows are saved there; once the cause is gone, run "
                       "the same command again to continue")


def _disk_full_error(plan: Plan, store: Store | None) -> OutputError:
    free = human_bytes(shutil.disk_usage(plan.path.parent).free)
    wrote = "" if store is None else f" after writing {human_bytes(store.bytes_written)}"
    saved = plan.resume_rows if store is None else store.num_committed
    of = "" if plan.num_rows is None else f" of {plan.num_rows}"
    kept = (f"{saved}{of} rows are saved in {plan.output.partial.name}; free space, then run "
            "the same command again to continue" if saved else
            "no rows were saved yet; free space, then run the same command again")
    return OutputError(f"the disk that holds {str(plan.path.parent)!r} is full ({free} free)"
                       f"{wrote}: {kept}")


def _loop(plan: Plan, loader, writer: BackgroundWriter, stop: StopRequest) -> int:
    """The main loop: one forward (and backward) per batch, captures handed to the writer.
    Returns the units of progress (samples, or positions) it computed."""
    feed = plan.feed
    total = feed.units(plan.dataset, plan.selection)  # None where not known before the end
    done = (0 if total is None else
            feed.units(plan.dataset, plan.selection[:plan.resume_from]))
    units = 0
    if stop:  # a signal came while the file was being opened
        raise _stopping(stop)
    with tqdm(total=total, initial=done, unit=feed.unit, unit_scale=True, dynamic_ncols=True,
              mininterval=1.0, desc="probe") as bar:
        for batch in loader:
            # every sample of a batch may have been left out
            computed = plan.compute(batch.to(plan.device)) if len(batch) else Computed({})
            writer.put(batch.index, batch.target, computed.rows, ready=computed.ready,
                       lengths=computed.lengths, ends_group=batch.ends_group,
                       skipped=batch.skipped)
            del computed  # the writer holds the rows now; the next batch need not wait for them
            units += feed.count(batch) if len(batch) else 0
            bar.update(feed.count(batch) if len(batch) else 0)
            bar.set_postfix_str(f"{human_bytes(writer.store.bytes_written)} written",
                                refresh=False)
            if stop:
                raise _stopping(stop)
    return units


class _Stopped(Exception):
    pass


def _stopping(stop: StopRequest) -> _Stopped:
    # Said here, at the batch boundary, not in the signal handler: a handler that logs can
    # interrupt another write to the same log file (submitit's handler, on a requeue's
    # SIGCONT), and the buffered writer refuses the reentrant call.
    log.warning("%s received: stopping after this batch", signal.Signals(stop.signum).name)
    return _Stopped()


@contextmanager
def _stop_signals(stop: StopRequest):
    """SIGINT and SIGTERM (Ctrl-C; SLURM before preemption or the time limit) ask the loop to
    stop at the next batch boundary; so does SIGUSR2 where a handler of Python code waits for
    it (submitit's, which requeues a job that is preempted or reaches its time limit): that
    handler then gets the signal, after the commit. A second signal acts as it would without
    probe."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous: dict[int, object] = {}

    def handler(signum, frame):
        stop.signum = signum
        signal.signal(signum, previous[signum])
        if callable(previous[signum]) and previous[signum] is not signal.default_int_handler:
            stop.hand_on = previous[signum]  # nothing else here: see _stopping

    signals = [signal.SIGINT, signal.SIGTERM]
    usr2 = getattr(signal, "SIGUSR2", None)
    if usr2 is not None and callable(signal.getsignal(usr2)):
        signals.append(usr2)
    for signum in signals:
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
