"""The writer's lock: one process at a time writes (or replaces) a run's file.

``WriterLock(path)`` holds an exclusive OS lock on ``<path>.lock`` for as long as one process
writes ``path``; the lock file says which process holds it (pid and host).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from pathlib import Path

from probe.errors import OutputError

__all__ = ["WriterLock"]

log = logging.getLogger(__name__)


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
