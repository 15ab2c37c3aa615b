"""``python -m probe``: compose the config with Hydra and run the pipeline (probe.runner.run).

A run that fails leaves no run folder behind when it made that folder itself; a folder that
holds an earlier attempt (its log, a partial file) is kept, and the error is logged to its
``probe.log`` too. Started by torchrun, each process runs one rank (probe.commands.ranks).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import sys
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.commands import ranks as torchrun

__all__ = ["main"]

log = logging.getLogger(__name__)

# what Hydra puts in a new run folder before the task starts (and, under torchrun, what the
# other ranks' Hydra puts there: their logs)
_HYDRA_FILES = {".hydra", "probe.log"}
_RANK_LOG = re.compile(r"probe\.rank-\d+\.log")  # torchrun.rank_log_name


def _without_a_trace(task):
    """Remove the run folder if the task fails and the folder holds nothing but what Hydra
    made for this launch (a log that an earlier launch wrote to is kept)."""

    @functools.wraps(task)
    def wrapped(cfg: DictConfig) -> None:
        ranks = torchrun.from_environment()
        if ranks is not None and not ranks.leader:
            return task(cfg)  # rank 0 decides for the folder that all share
        folder = _run_folder()
        log_file = None if folder is None else folder / "probe.log"
        fresh = (folder is not None and _only_hydra_files(folder)
                 and (not log_file.exists() or log_file.stat().st_size == 0))
        try:
            task(cfg)
        except BaseException:
            if fresh and _only_hydra_files(folder):
                _remove(folder)
            raise
    return wrapped


def _run_folder() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return Path(HydraConfig.get().runtime.output_dir)


def _only_hydra_files(folder: Path) -> bool:
    return folder.is_dir() and all(p.name in _HYDRA_FILES or _RANK_LOG.fullmatch(p.name)
                                   for p in folder.iterdir())


def _remove(folder: Path) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):  # Hydra's file handler holds probe.log open
        if isinstance(handler, logging.FileHandler) and folder in Path(
                handler.baseFilename).parents:
            root.removeHandler(handler)
            handler.close()
    shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.parents:  # outputs/ (or outputs/multirun/) if this left it empty
        if parent == Path.cwd() or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()


@_without_a_trace  # outside: the error is logged (and printed) first
@exit_on_user_error
def _run(cfg: DictConfig) -> None:
    from probe.runner import run

    ranks = torchrun.from_environment()
    if ranks is None:
        run(cfg)
    else:
        torchrun.run(cfg, ranks)


def main() -> None:
    """``python -m probe``: run the pipeline (one rank of it, when torchrun started it)."""
    _refuse_a_read_only_directory(sys.argv[1:])
    ranks = torchrun.from_environment()
    if ranks is not None:
        sys.argv += torchrun.prepare(ranks, sys.argv[1:])
    hydra_command("config", "python -m probe")(_run)()


def _refuse_a_read_only_directory(args: list[str]) -> None:
    # Hydra keeps every run's config and log under outputs/ here; in a folder that cannot be
    # written it would fail with a traceback before probe could say anything
    if any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "--help", "-h", "--cfg", "-c",
                         "--info", "--hydra-help")) for a in args):
        return
    if not os.access(Path.cwd(), os.W_OK | os.X_OK):
        print(f"probe: error: the current folder {str(Path.cwd())!r} is not writable, and each "
              "run keeps its config and log in outputs/ under it; run from a writable folder, "
              "or set hydra.run.dir=/a/writable/folder", file=sys.stderr)
        sys.exit(1)
