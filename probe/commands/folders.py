"""A run that fails leaves no run folder behind when it made that folder itself; a folder that
holds an earlier attempt (its log, a partial file) is kept."""

from __future__ import annotations

import functools
import logging
import re
import shutil
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import ranks as torchrun

__all__ = ["without_a_trace"]

# what Hydra puts in a new run folder before the task starts (and, under torchrun, what the
# other ranks' Hydra puts there: their logs)
_HYDRA_FILES = {".hydra", "probe.log"}
_RANK_LOG = re.compile(r"probe\.rank-\d+\.log")  # torchrun.rank_log_name


def without_a_trace(task):
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
