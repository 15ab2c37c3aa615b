"""A run's output, from "is there a run here" to "finished", in one object (``Output``): where
the file goes, what a run there left, the lock that keeps a second writer out (``WriterLock``,
probe.file.lock), the space it needs, and the last steps.

    output = Output(cfg.output.path, config_yaml, locking=..., overwrite=...)
    output.found                       # the run there for this config (None: none), read
                                       # under the lock; a file of another config is refused
    output.rows_before(sample, ...)    # resuming: what the found run kept before a sample
    output.check_space(bytes)          # refuse a run that cannot fit on the disk
    with output.writing() as as_found: # the lock held while the store writes
        ...                            # (False: another run finished it meanwhile)
    output.rename_finished()           # a complete file stopped before its rename

The functions below it (``output_path``, ``existing_run``, ``check_free_space``, ...) are its
steps, for the commands that need one alone (a torchrun rank's leader).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from probe.errors import ConfigError, OutputError
from probe.file.format import (
    INDEX,
    SKIPPED,
    FileState,
    creating_path,
    partial_path,
    read_state,
)
from probe.file.lock import WriterLock
from probe.file.partial import open_for_reading, recover
from probe.file.recorded import differing_keys
from probe.file.sizes import human_bytes

__all__ = ["Output", "output_path", "file_locking", "check_writable", "existing_run",
           "check_free_space", "WriterLock"]

log = logging.getLogger(__name__)


class Output:
    """A run's output, from "is there a run here" to "finished" (see the module's docstring):
    ``path``, the file; ``partial``, where it is written until complete; ``found``, what a
    run of this config left there (None: nothing, or ``overwrite``).

    Raises:
        ConfigError: an ``output.file_locking`` that is not one.
        OutputError: no ``output.path`` outside a Hydra run, a folder that cannot be written,
            another process writing the file now, or a file there that is not this config's
            run (see ``existing_run``).
    """

    def __init__(self, path: str | None, config_yaml: str, *, locking=None,
                 overwrite: bool = False):
        self.path = output_path(path)
        self.partial = partial_path(self.path)
        self.locking = file_locking(locking)
        self.config_yaml, self.overwrite = config_yaml, overwrite
        check_writable(self.path.parent)
        with self.lock():  # refuse now, not after the set-up, if another process writes
            self.found = existing_run(self.path, config_yaml, self.locking, overwrite=overwrite)

    @property
    def committed(self) -> int:
        """The rows the found run had committed (0: none found)."""
        return 0 if self.found is None else self.found.num_committed

    def lock(self) -> WriterLock:
        """The lock that one writer of this file holds."""
        return WriterLock(self.path, self.locking)

    def rows_before(self, sample: int, rows: int, skipped: int) -> tuple[int, int]:
        """Of the found run's first ``rows`` rows and ``skipped`` samples left out, how many
        come before dataset sample ``sample`` (both are in dataset order)."""
        with open_for_reading(self.found.path, self.locking) as f:
            index, left_out = f[INDEX][:rows], f[SKIPPED][:skipped]
        return int(np.searchsorted(index, sample)), int(np.searchsorted(left_out, sample))

    def check_space(self, needed: int) -> None:
        """Refuse a run of about ``needed`` bytes that the disk cannot hold (``OutputError``)."""
        check_free_space(self.path.parent, needed)

    @contextmanager
    def writing(self) -> Iterator[bool]:
        """For the block, this process holds the lock; yields whether the output is as it was
        found (False: another run finished it meanwhile, and there is nothing to do). With
        ``overwrite``, what was there is gone first.

        Raises:
            OutputError: another run wrote rows to it meanwhile.
        """
        with self.lock():
            if self.overwrite:
                existing_run(self.path, self.config_yaml, self.locking, overwrite=True)
                self.partial.unlink(missing_ok=True)
                yield True
                return
            found = existing_run(self.path, self.config_yaml, self.locking)
            if found is not None and found.complete:
                log.info("%s was completed by another run meanwhile; nothing to do", self.path)
                yield False
                return
            if (0 if found is None else found.num_committed) != self.committed:
                raise OutputError(f"{str(self.path)!r} changed since this run was planned "
                                  "(another run wrote to it); run the command again")
            yield True

    def rename_finished(self) -> Path:
        """Give the found file, complete but stopped before its rename, its name."""
        with self.lock():
            recover(self.partial)  # its writer was killed with it open
            os.replace(self.partial, self.path)
        return self.path


def output_path(path: str | None) -> Path:
    """``output.path``, or ``<Hydra run dir>/features.h5`` when it is null.

    Raises:
        OutputError: output.path is null outside a Hydra run.
    """
    if path is not None:
        return Path(str(path)).expanduser().absolute()
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


def existing_run(path: Path, config_yaml: str, locking: bool | str | None = None, *,
                 overwrite: bool = False) -> FileState | None:
    """The run already at ``path`` for this config: the finished file's state, else the
    ``.partial`` file's, else None (also with ``overwrite``, once every file there is known to
    be probe's own). A partial file that cannot be read, or a file that a run was still making
    when it was stopped (``<path>.partial.new``), held nothing committed: it is removed, with
    a log line, and the run starts again.

    Raises:
        OutputError: ``path`` is a folder, or a file that probe did not write (never replaced,
            ``overwrite`` or not); or, without ``overwrite``, a probe file of another config, or
            a finished file that is not complete.
    """
    if path.is_dir():
        raise OutputError(f"output.path={str(path)!r} is a folder; name a file in it, e.g. "
                          f"output.path={str(path / 'features.h5')!r}")
    _forget(creating_path(path), "a run was stopped while it created it")
    found: FileState | None = None
    if path.exists():
        found = _read(path, path, locking)
        if found is None:
            raise OutputError(f"{str(path)!r} is not a readable probe file (another "
                              "program's, or a probe file cut short), and probe never replaces "
                              "such a file; move it away or delete it to start over, or choose "
                              "another output.path")
    partial = partial_path(path)
    if found is None and partial.exists():
        found = _read(partial, path, locking)
        if found is None:
            _forget(partial, "it cannot be read, so none of its rows can be used")
    if found is None or overwrite:
        return None
    differing = differing_keys(yaml.safe_load(found.config), yaml.safe_load(config_yaml))
    if differing:
        raise OutputError(
            f"{str(found.path)!r} holds a run of another config (differs in: "
            f"{', '.join(differing)}); choose another output.path or set "
            "output.overwrite=true to replace it"
        )
    if found.path == path and not found.complete:
        raise OutputError(f"{str(path)!r} exists but is not complete; set "
                          "output.overwrite=true to start again")
    return found


def _read(path: Path, output: Path, locking: bool | str | None) -> FileState | None:
    """The state of the probe file ``path`` (``output`` or its partial file); None for a file
    that is not one (or not readable).

    Raises:
        OutputError: another process holds the file open for writing.
    """
    try:
        with open_for_reading(path, locking) as f:
            return read_state(f, path)
    except (OSError, KeyError) as err:
        if "unable to lock" in str(err).lower():
            raise OutputError(WriterLock(output).held_message()) from None
        log.debug("%s is not a readable probe file: %s", path, err)
        return None


def _forget(path: Path, why: str) -> None:
    # a file of probe's own, by its name, that holds nothing a run can use
    if path.exists():
        log.warning("removing %s (%s); starting again", path, why)
        path.unlink()


def check_free_space(directory: Path, needed: int) -> None:
    """Refuse a run whose estimated size does not fit on the disk that holds ``directory``.

    Raises:
        OutputError: with both numbers, and how to skip the check.
    """
    free = shutil.disk_usage(directory).free
    log.info("estimated size %s; %s free in %s", human_bytes(needed), human_bytes(free),
             directory)
    if needed > free:
        raise OutputError(
            f"the run needs about {needed / 2**30:.2f} GiB but {str(directory)!r} has "
            f"{free / 2**30:.2f} GiB free; free space, choose another output.path, use "
            "reduce=mean or output.dtype=float16, or set output.check_free_space=false"
        )
