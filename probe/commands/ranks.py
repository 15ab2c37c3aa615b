"""``torchrun --nproc-per-node=K -m probe ...``: every device of a node from one command.

torchrun (or ``python -m torch.distributed.run``) starts K copies of ``python -m probe`` and
tells each which it is (RANK, WORLD_SIZE, LOCAL_RANK). Rank r of K takes the strided shard of
the job's ``shard.index=c shard.count=C`` that probe.pipeline.shards nests for it (samples
``i % (C * K) == c + C * r``), runs on its own device (``cuda:LOCAL_RANK`` for ``device=auto``
or ``cuda`` where CUDA is), and writes ``<stem>.rank-<r>-of-<K>.h5`` beside the output path,
with the usual resume. When every rank is done, rank 0 merges their files (virtual datasets)
into the output path: the file one process would have written, shard c of C.

A gloo process group joins the ranks at the start (one output path for all, a plan checked on
every rank before any computes) and at the end (rank 0 merges once all are done), never inside
the loop. A rank that fails prints its one line and exits 1; torchrun then sends SIGTERM to the
others, which stop at a batch boundary with their rows committed, and the command fails. The
same command again resumes every rank's file; once the merged file is there, it does nothing.

Only rank 0 writes Hydra's own files in the run folder (``.hydra/``, ``probe.log``) and shows
the progress bar; rank r logs to ``probe.rank-<r>.log`` there, and prints warnings only.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from omegaconf import DictConfig

from probe.errors import DeviceError, ProbeError, RunStopped

__all__ = ["Ranks", "from_environment", "prepare", "rank_device", "rank_log_name", "run"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# how long a rank that is done waits at the end for the slowest one (gloo's default is 30 min;
# a resumed launch can have one rank with most of its shard left)
_WAIT = timedelta(days=7)
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Ranks:
    """Which process of a torchrun launch this is."""

    rank: int  # among all processes (of every node, with torchrun --nnodes)
    count: int  # WORLD_SIZE
    local_rank: int  # among this node's processes: the device it gets

    @property
    def leader(self) -> bool:
        return self.rank == 0


def from_environment() -> Ranks | None:
    """The ranks torchrun started this process among, from its environment; None for a plain
    process (or a torchrun launch of one process, which is one)."""
    if not all(name in os.environ for name in _TORCHRUN_VARIABLES):
        return None
    ranks = Ranks(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                  int(os.environ["LOCAL_RANK"]))
    return ranks if ranks.count > 1 else None


def rank_log_name(rank: int, job_name: str = "probe") -> str:
    """The log file of rank ``rank`` (> 0) in the run folder; rank 0 keeps Hydra's own."""
    return f"{job_name}.rank-{rank}.log"


def prepare(ranks: Ranks, args: list[str]) -> list[str]:
    """What rank ``ranks.rank`` adds to its command line before Hydra reads it: every rank but
    0 leaves Hydra's files in the run folder (``.hydra/``, ``probe.log``) to rank 0, so that
    they do not race on them, and logs to a file of its own; it shows no progress bar."""
    if ranks.leader:
        return []
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by tqdm when it is imported, later
    extra = ["hydra.output_subdir=null"]
    if not any(a.lstrip("+~").startswith(("hydra/job_logging", "hydra.job_logging"))
               for a in args):  # a logging config of the user's own is left as it is
        name = rank_log_name(ranks.rank, "${hydra.job.name}")
        extra.append("hydra.job_logging.handlers.file.filename=${hydra.runtime.output_dir}/"
                     + name)
    return extra


def run(cfg: DictConfig, ranks: Ranks) -> Path:
    """This rank's part of a torchrun launch of ``cfg``; rank 0 returns the merged file.

    Raises:
        ProbeError: a config value, file or device that cannot work, on this rank; or
            ``RunStopped`` when a signal (torchrun's, after another rank failed) stopped it.
        SystemExit: another rank failed before any computed (1 when this rank failed the
            same way, which that rank reports; 0 otherwise).
    """
    import torch.distributed as dist

    _quiet_console(ranks)
    if not dist.is_initialized():  # once per process: a multirun's jobs share it
        dist.init_process_group("gloo", timeout=_WAIT)
        # torn down before the interpreter's own teardown: gloo's threads, left to C++'s
        # static destructors, now and then aborted a rank at exit ("terminate called without
        # an active exception"), failing a launch whose work was done
        atexit.register(dist.destroy_process_group)
    with _error_file():
        return _run(cfg, ranks)


def _run(cfg: DictConfig, ranks: Ranks) -> Path:
    import torch.distributed as dist

    from probe.data.selection import check_selection
    from probe.file.merge import merge
    from probe.file.output import WriterLock, file_locking, output_path
    from probe.pipeline.execute import execute
    from probe.pipeline.execute import run as run_one
    from probe.pipeline.plan import plan
    from probe.pipeline.shards import nested_shard, rank_path

    index, count = int(cfg.shard.index), int(cfg.shard.count)

    def start() -> tuple[str, Path | None]:
        check_selection(cfg.limit, index, count)
        return (rank_device(str(cfg.device), ranks.local_rank),
                output_path(cfg.output.path) if ranks.leader else None)

    device, path = _together(ranks, start)
    # rank 0's path for all: the ranks' run folders differ where it holds a time, say
    path = _from_leader(path)
    node = _with(cfg, path=path, device=device)
    if path.exists() and not cfg.output.overwrite:
        # a finished launch: rank 0 checks that it is of this config, model and data
        _together(ranks, lambda: run_one(node) if ranks.leader else None)
        return path
    if ranks.leader:
        _warn_about_other_launches(path, ranks.count)
    mine = _with(cfg, path=rank_path(path, ranks.rank, ranks.count), device=device,
                 shard=nested_shard(index, count, ranks.rank, ranks.count))
    log.info("rank %d of %d: shard %d of %d, into %s", ranks.rank, ranks.count,
             *nested_shard(index, count, ranks.rank, ranks.count), mine.output.path)
    execute(_together(ranks, lambda: plan(mine)))
    _release_memory()
    dist.barrier()  # every rank's file is complete
    if not ranks.leader:
        return path
    files = [rank_path(path, r, ranks.count) for r in range(ranks.count)]
    with WriterLock(path, file_locking(cfg.output.file_locking)):
        return merge(path, files, into=(index, count), overwrite=bool(cfg.output.overwrite))


def rank_device(asked: str, local_rank: int) -> str:
    """The device of the rank with ``local_rank`` on its node: ``cuda:<local_rank>`` for
    ``auto`` and ``cuda`` on a node with CUDA; any other choice is kept as it is (an explicit
    ``cuda:N`` puts every rank on that device).

    Raises:
        DeviceError: the node has fewer CUDA devices than ranks.
    """
    import torch

    spec = asked.strip().lower()
    # without CUDA, device=cuda is left to the plan, which says so in its own words
    if spec in ("auto", "cuda") and torch.cuda.is_available():
        available = torch.cuda.device_count()
        if local_rank >= available:
            raise DeviceError(
                f"device={asked} gives each rank a CUDA device of its own, but this node has "
                f"{available}, and this is local rank {local_rank}: start at most {available} "
                f"ranks per node (torchrun --nproc-per-node={available}), or name a "
                "device for all (device=cuda:0, device=cpu)"
            )
        torch.cuda.set_device(local_rank)  # no rank makes a context on device 0 by chance
        return f"cuda:{local_rank}"
    return asked


def _together(ranks: Ranks, step: Callable[[], _T]) -> _T:
    """``step`` on every rank, then a word between them: if it failed anywhere, every rank
    stops, and each distinct message is printed once (by the lowest rank with it), so that a
    config error that every rank meets reads as one line."""
    import torch.distributed as dist

    result, error = None, None
    try:
        result = step()
    except RunStopped:
        raise
    except ProbeError as err:
        error = err
    messages = [None] * ranks.count
    dist.all_gather_object(messages, None if error is None else str(error))
    if error is not None:
        if messages.index(str(error)) == ranks.rank:
            raise error
        log.info("rank %d failed too: %s", messages.index(str(error)), error)
        _write_error_file(str(error))
        raise SystemExit(1)
    if any(messages):
        failed = [r for r, message in enumerate(messages) if message]
        log.info("not going on: rank(s) %s failed", failed)
        raise SystemExit(0)
    return result


def _from_leader(value: _T) -> _T:
    import torch.distributed as dist

    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _with(cfg: DictConfig, *, path: Path, device: str,
          shard: tuple[int, int] | None = None) -> DictConfig:
    out = copy.deepcopy(cfg)
    out.output.path = str(path)
    out.device = device
    if shard is not None:
        out.shard.index, out.shard.count = shard
    return out


def _warn_about_other_launches(path: Path, count: int) -> None:
    from probe.pipeline.shards import rank_files

    others = [p.name for p in rank_files(path) if not p.stem.endswith(f"-of-{count}")]
    if others:
        log.warning("%s holds the files of a launch with another number of ranks (%s); this "
                    "launch of %d does not use them (they can be deleted once it is done)",
                    path.parent, ", ".join(others), count)


def _quiet_console(ranks: Ranks) -> None:
    # the console shows rank 0's log; the others' goes to their own files, but for warnings
    if ranks.leader:
        return
    for handler in logging.getLogger().handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.WARNING)


def _release_memory() -> None:
    # a rank that is done waits for the others: without its model and batches
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def _error_file():
    """A ProbeError leaving this rank is also written where torchrun's summary of the failure
    looks for it (TORCHELASTIC_ERROR_FILE), so that the summary names it."""
    try:
        yield
    except RunStopped:
        raise
    except ProbeError as err:
        _write_error_file(str(err))
        raise


def _write_error_file(message: str) -> None:
    # the layout of torch.distributed.elastic's ErrorHandler.record_exception, with the one
    # line in place of a traceback (the summary shows py_callstack)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        line = f"probe: error: {message}"
        with open(path, "w") as f:
            json.dump({"message": {"message": line, "extraInfo": {
                "py_callstack": line, "timestamp": str(int(time.time()))}}}, f)
