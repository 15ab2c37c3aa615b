"""Where a run's file goes, and what a run finds there before it starts.

``output_path`` resolves ``output.path``; ``existing_run`` reads the state of a file (finished or
partial) at that path and refuses one of another config; ``check_free_space`` refuses a run that
cannot fit on the disk. All of it happens before any compute. ``WriterLock`` keeps a second
process from writing (or replacing) a file while one writes it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
from pathlib import Path

import yaml

from probe.errors import ConfigError, OutputError
from probe.file.format import FileState, creating_path, partial_path, read_state
from probe.file.partial import open_for_reading
from probe.file.recorded import differing_keys
from probe.file.sizes import human_bytes

__all__ = ["output_path", "file_locking", "check_writable", "existing_run", "check_free_space",
           "WriterLock"]

log = logging.getLogger(__name__)


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


class WriterLock:
    """An exclusive lock on ``<path>.lock`` for as long as one process writes ``path``; the
    lock file says which process holds it (pid and host) and is removed on release.

    Example::

        with WriterLock(path):
            ...   # no other process can take the lock here, overwrite or not

    An OS lock (flock) does the excluding, so a process that dies releases it at once; a
    lock file it leaves behind is taken over by the next run.

    Raises:
        OutputError: another process holds the lock, or the file system cannot lock (then
            ``locking`` false or best-effort, as for HDF5's own locking, runs without).
    """

    def __init__(self, path: Path, locking: bool | str | None = None):
        self.path = path.with_name(path.name + ".lock")
        self.locking = locking
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not on this platform: HDF5's own locking is all there is
            return
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EAGAIN, errno.EACCES):
                    raise OutputError(self.held_message()) from None
                if self.locking in (False, "best-effort"):
                    log.debug("not locking %s: %s", self.path, err)
                    return
                raise OutputError(
                    f"cannot lock {str(self.path)!r} ({err.strerror or err}); on a file system "
                    "without locks (some NFS mounts) set output.file_locking=false, and make "
                    "sure that one process at a time writes each file"
                ) from None
            if _same_file(fd, self.path):  # not a lock file that its holder removed meanwhile
                self._fd = fd
            else:
                os.close(fd)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
                 .encode())

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still held: nobody can lock it meanwhile
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str | None:
        """Who holds the lock now ("process P on host H"), or None when no process does."""
        try:
            import fcntl
            fd = os.open(self.path, os.O_RDONLY)
        except (ImportError, OSError):  # no lock file: nobody writes
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # refused while a writer holds it
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        except OSError:
            return self._who()
        finally:
            os.close(fd)

    def _who(self) -> str:
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        return (f"process {holder['pid']} on {holder['host']}" if {"pid", "host"} <= set(holder)
                else "another process")

    def held_message(self) -> str:
        """Who holds the lock, and what to do about it."""
        who = self._who()
        target = self.path.with_name(self.path.name.removesuffix(".lock"))
        return (f"{who} is writing {str(target)!r} (it holds {self.path.name}); no run may write "
                "or replace a file while another writes it, output.overwrite=true included: "
                "wait for that run to end, or stop it")


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
