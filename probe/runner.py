"""The runner: from a composed config to a finished HDF5 file.

``run(cfg)`` is ``execute(plan(cfg))``: the plan decides everything that can fail before a file
exists (probe.planner); the execution feeds each batch's captures to a writer thread and the
store. The hooks are removed whether the run ends or fails.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn
from tqdm import tqdm

from probe.config import option_name
from probe.errors import OutputError, RunStopped
from probe.format import partial_path
from probe.hooks import StopForward
from probe.output import WriterLock, existing_run
from probe.partial import recover
from probe.planner import Plan, plan
from probe.store import Store
from probe.units import human_bytes
from probe.writer import BackgroundWriter

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
    executes, or by a caller that wants a run to stop (``signum`` names the reason)."""

    def __init__(self, signum: int | None = None):
        self.signum = signum

    def __bool__(self) -> bool:
        return self.signum is not None


def execute(plan: Plan, *, stop: StopRequest | None = None) -> Path:
    """Carry out a plan: stream every remaining row into the store; return the file's path.

    Raises:
        RunStopped: SIGINT, SIGTERM or ``stop`` ended the run at a batch boundary; the rows
            written so far are committed.
    """
    if plan.done:
        if plan.renamed_only:
            with WriterLock(plan.path, plan.locking):
                recover(partial_path(plan.path))  # its writer was killed with it open
                os.replace(partial_path(plan.path), plan.path)
        return plan.path
    with WriterLock(plan.path, plan.locking):
        if not _still_as_planned(plan):
            return plan.path
        return _write(plan, stop if stop is not None else StopRequest())


def _still_as_planned(plan: Plan) -> bool:
    """Whether the output is as the plan found it, now that this process holds the lock (a run
    that finished meanwhile makes this one unnecessary; one that wrote rows, wrong)."""
    if plan.cfg.output.overwrite:
        partial_path(plan.path).unlink(missing_ok=True)
        return True
    found = existing_run(plan.path, plan.config_yaml, plan.locking)
    if found is not None and found.complete:
        log.info("%s was completed by another run meanwhile; nothing to do", plan.path)
        return False
    if (0 if found is None else found.num_committed) != plan.committed:
        raise OutputError(f"{str(plan.path)!r} changed since this run was planned (another run "
                          "wrote to it); run the command again")
    return True


def _write(plan: Plan, stop: StopRequest) -> Path:
    cfg, capture = plan.cfg, plan.capture
    started = time.perf_counter()
    loader = plan.feed.loader(plan.dataset, plan.indices[plan.resume_from:], plan.batching)
    store = Store(plan.path, config_yaml=plan.config_yaml, num_rows=plan.num_rows,
                  datasets=plan.datasets, has_target=plan.has_target,
                  token_rows=plan.feed.token_rows, num_tokens=plan.num_tokens,
                  resume_from=plan.resume_from,
                  compression=option_name(cfg.output.compression),
                  compression_level=cfg.output.compression_level, attrs=plan.attrs,
                  locking=plan.locking)
    try:
        with store, BackgroundWriter(store, commit_every_batches=int(cfg.output.commit_every),
                                     commit_every_seconds=float(cfg.output.commit_seconds)
                                     ) as writer:
            with capture, _frozen_parameters(plan.model, capture.needs_grad), \
                    _stop_signals(stop):
                units = _loop(plan, loader, writer, stop)
            writer.close()
            store.finish()
    except _Stopped:
        of = "" if plan.num_rows is None else f" of {plan.num_rows}"
        saved = (f"with {store.num_committed}{of} rows saved in {store.partial}; run the same "
                 "command again to resume" if store.partial.exists() else
                 "before any rows were saved; run the same command again to start")
        name = signal.Signals(stop.signum).name
        raise RunStopped(f"stopped by {name} {saved}", exit_code=128 + int(stop.signum)) from None
    seconds = time.perf_counter() - started
    log.info("wrote %d rows (%s) in %.1f s: %.3g %s/s, %s/s, to %s",
             store.num_written - plan.resume_from, human_bytes(store.bytes_written), seconds,
             units / seconds, plan.feed.unit, human_bytes(store.bytes_written / seconds),
             plan.path)
    return plan.path


def _loop(plan: Plan, loader, writer: BackgroundWriter, stop: StopRequest) -> int:
    """The main loop: one forward (and backward) per batch, captures handed to the writer.
    Returns the units of progress (samples, or tokens) it computed."""
    model, capture, feed = plan.model, plan.capture, plan.feed
    total = feed.units(plan.dataset, plan.indices)  # None for a stream: not known
    done = 0 if total is None else feed.units(plan.dataset, plan.indices[:plan.resume_from])
    units = 0
    with tqdm(total=total, initial=done, unit=feed.unit, unit_scale=True, dynamic_ncols=True,
              mininterval=1.0, desc="probe") as bar:
        for batch in loader:
            on_device = batch.to(plan.device)
            capture.keep = on_device.keep
            if capture.needs_grad:
                # parameters are frozen: the graph starts at the hooked modules (or at the
                # input, when gradients at a module's input are asked for)
                with torch.enable_grad():
                    output = feed.forward(model, on_device, input_grad=capture.wants_input_grad)
                    capture.backward(plan.objective(output, on_device).sum())
            else:
                # StopForward: every hooked module has run, the rest of the model is not needed
                with torch.inference_mode(), suppress(StopForward):
                    feed.forward(model, on_device)
            writer.put(batch.index, batch.target, {**capture.take(), **batch.token_rows},
                       ready=capture.copied, lengths=batch.lengths,
                       window_end=batch.window_end)
            units += feed.count(batch)
            bar.update(feed.count(batch))
            bar.set_postfix_str(f"{human_bytes(writer.store.bytes_written)} written",
                                refresh=False)
            if stop:
                raise _Stopped
    return units


class _Stopped(Exception):
    pass


@contextmanager
def _stop_signals(stop: StopRequest):
    """SIGINT and SIGTERM (Ctrl-C; SLURM before preemption or the time limit) ask the loop to
    stop at the next batch boundary. A second one acts as it would without probe."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous: dict[int, object] = {}

    def handler(signum, frame):
        stop.signum = signum
        signal.signal(signum, previous[signum])
        log.warning("%s received: stopping after this batch", signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextmanager
def _frozen_parameters(model: nn.Module, active: bool):
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

