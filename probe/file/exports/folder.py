"""Where an export writes, and what it says it wrote.

An export never leaves half a folder: it writes into a hidden folder beside ``out_dir`` and
renames it to ``out_dir`` once every file is complete and on disk (fsynced, so that a crash
after the rename cannot leave a whole-looking folder of missing bytes; a failure, or Ctrl-C,
removes it). An ``out_dir`` that holds anything is refused unless ``overwrite``, and then
replaced only after the new one is whole.

    with staged(Path("feats/a_export"), source=Path("feats/a.h5"), overwrite=False) as folder:
        ...                                  # write into folder
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from probe.errors import OutputError, ProbeError

__all__ = ["Written", "Exported", "default_out_dir", "check_out_dir", "staged", "size_text"]


@dataclass(frozen=True)
class Written:
    """One file an export wrote: its path, rows (None for a file of metadata) and bytes."""

    path: Path
    rows: int | None

    @property
    def bytes(self) -> int:
        return self.path.stat().st_size


@dataclass
class Exported:
    """What an export wrote: the route, the folder, each file, and notes for the log."""

    route: str
    out_dir: Path
    files: list[Written]
    notes: list[str] = field(default_factory=list)
    # "<key>: stored as ...": the keys the file holds compact (float8, pca, ...), written decoded
    stored: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(w.bytes for w in self.files)

    def lines(self) -> list[str]:
        """A line per file, then the total: what the command prints."""
        lines = [f"{w.path}  " + ("" if w.rows is None else f"{w.rows} rows  ")
                 + size_text(w.bytes) for w in self.files]
        count = f"{len(self.files)} file" + ("s" if len(self.files) != 1 else "")
        return [*lines, f"to={self.route}: wrote {count}, {size_text(self.bytes)}, in "
                        f"{self.out_dir}"]


def default_out_dir(file: str | Path) -> Path:
    """``<file's folder>/<file stem>_export``."""
    file = Path(file)
    return file.with_name(f"{file.stem}_export")


def check_out_dir(out_dir: Path, *, source: Path, overwrite: bool) -> None:
    """Refuse an ``out_dir`` that cannot take the export, before any work.

    Raises:
        OutputError: it is a file, it holds something (and not ``overwrite``), or it holds
            the file being exported.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"out_dir={str(out_dir)!r} is a file, not a folder; choose another "
                          "out_dir")
    if source.resolve().is_relative_to(out_dir.resolve()):
        raise OutputError(f"out_dir={str(out_dir)!r} holds file={str(source)!r} itself; choose "
                          "a folder of its own, such as the default <file stem>_export")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise OutputError(f"out_dir={str(out_dir)!r} is not empty; choose another out_dir, or "
                          "add overwrite=true to replace it")


@contextmanager
def staged(out_dir: Path, *, source: Path, overwrite: bool) -> Iterator[Path]:
    """A hidden folder beside ``out_dir`` for the block to write into, renamed to ``out_dir``
    when the block ends well and removed when it does not.

    Raises:
        OutputError: as check_out_dir, or the folder cannot be made or written.
    """
    check_out_dir(out_dir, source=source, overwrite=overwrite)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.",
                                       suffix=".exporting"))
    except OSError as err:
        raise OutputError(f"cannot write to out_dir={str(out_dir)!r} ({err.strerror or err}); "
                          "choose a writable out_dir") from None
    try:
        yield folder
        _sync(folder)
        _replace(out_dir, folder)
        _sync_folder(out_dir.parent)
    except OSError as err:
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(err, ProbeError):  # a DataError is an OSError too
            raise
        raise OutputError(f"cannot write to out_dir={str(out_dir)!r} ({err.strerror or err}); "
                          "choose a writable out_dir with room for the export") from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _replace(out_dir: Path, folder: Path) -> None:
    # the old folder moves aside first, so that out_dir is at each moment the old or the new one
    os.chmod(folder, 0o777 & ~_umask())  # mkdtemp makes it 0700
    if not out_dir.exists():
        folder.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".old"))
    old.rmdir()
    out_dir.rename(old)
    folder.rename(out_dir)
    shutil.rmtree(old, ignore_errors=True)


def _sync(folder: Path) -> None:
    # every file's bytes, then every folder's entries
    for path in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_file():
            with path.open("rb") as stream:
                os.fsync(stream.fileno())
        else:
            _sync_folder(path)
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def size_text(count: float) -> str:
    """Bytes as people read them: 512 B, 1.5 KiB, 2.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")
