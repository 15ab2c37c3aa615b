"""Where a run's file goes, and what a run finds there before it starts.

``output_path`` resolves ``output.path``; ``existing_run`` reads the state of a file (finished or
partial) at that path and refuses one of another config; ``check_free_space`` refuses a run that
cannot fit on the disk. All of it happens before any compute.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import h5py
import yaml
from omegaconf import DictConfig

from probe.config import differing_keys
from probe.errors import ConfigError, OutputError
from probe.format import FileState, partial_path, read_state

__all__ = ["output_path", "file_locking", "check_writable", "existing_run", "check_free_space"]

log = logging.getLogger(__name__)


def output_path(cfg: DictConfig) -> Path:
    """``output.path``, or ``<Hydra run dir>/features.h5`` when it is null.

    Raises:
        OutputError: output.path is null outside a Hydra run.
    """
    if cfg.output.path is not None:
        return Path(str(cfg.output.path)).expanduser().absolute()
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise OutputError("output.path is not set and there is no Hydra run directory; "
                          "set output.path=<file>.h5")
    return Path(HydraConfig.get().runtime.output_dir) / "features.h5"


def file_locking(value) -> bool | str | None:
    """The ``locking`` argument of ``h5py.File`` for the config's ``output.file_locking``.

    Raises:
        ConfigError: a value other than null, true, false or best-effort.
    """
    if value is None or isinstance(value, bool) or value == "best-effort":
        return value
    raise ConfigError(f"output.file_locking={value!r}: use null, true, false or best-effort")


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove that a file can be written in it.

    Raises:
        OutputError: it cannot.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe_file = directory / f".probe-write-test-{os.getpid()}"
        probe_file.touch()
        probe_file.unlink()
    except OSError as err:
        raise OutputError(
            f"cannot write to the output directory {str(directory)!r} ({err.strerror or err}); "
            "choose a writable output.path"
        ) from None


def existing_run(path: Path, config_yaml: str, locking: bool | str | None = None
                 ) -> FileState | None:
    """The run already at ``path`` for this config: the finished file's state, else the
    ``.partial`` file's, else None.

    Raises:
        OutputError: the file there is not a probe file, belongs to another config, or is a
            finished file that is not complete.
    """
    for candidate, finished in ((path, True), (partial_path(path), False)):
        if candidate.exists():
            state = _read(candidate, locking)
            differing = differing_keys(yaml.safe_load(state.config), yaml.safe_load(config_yaml))
            if differing:
                raise OutputError(
                    f"{str(candidate)!r} holds a run of another config (differs in: "
                    f"{', '.join(differing)}); choose another output.path or set "
                    "output.overwrite=true to replace it"
                )
            if finished and not state.complete:
                raise OutputError(f"{str(candidate)!r} exists but is not complete; set "
                                  "output.overwrite=true to start again")
            return state
    return None


def _read(path: Path, locking: bool | str | None) -> FileState:
    try:
        with h5py.File(path, "r", locking=locking) as f:
            return read_state(f, path)
    except (OSError, KeyError) as err:
        raise OutputError(
            f"{str(path)!r} exists but is not a readable probe file ({err}); choose another "
            "output.path or set output.overwrite=true to replace it"
        ) from None


def check_free_space(directory: Path, needed: int) -> None:
    """Refuse a run whose estimated size does not fit on the disk that holds ``directory``.

    Raises:
        OutputError: with both numbers, and how to skip the check.
    """
    free = shutil.disk_usage(directory).free
    log.info("estimated size %.1f MiB; %.1f MiB free in %s", needed / 2**20, free / 2**20,
             directory)
    if needed > free:
        raise OutputError(
            f"the run needs about {needed / 2**30:.2f} GiB but {str(directory)!r} has "
            f"{free / 2**30:.2f} GiB free; free space, choose another output.path, use "
            "reduce=mean or output.dtype=float16, or set output.check_free_space=false"
        )
