"""What the analyses write beside a file, and print: their out_dir, CSV tables, aligned text.

    out = beside("feats/resnet18.h5", "fit")        # feats/resnet18_fit
    with writing(out):
        write_csv(out / "probes.csv", COLUMNS, rows)
    print(aligned([header, *rows]))
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from probe.errors import OutputError

__all__ = ["beside", "check_writable", "writing", "write_csv", "aligned"]


def beside(path: str | Path, analysis: str) -> Path:
    """``<file's folder>/<file stem>_<analysis>``: where an analysis writes by default."""
    path = Path(path)
    return path.with_name(f"{path.stem}_{analysis}")


def check_writable(out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """``out_dir``, once it is known that it can be made and written, and holds no earlier
    findings (unless ``overwrite``), before any work and without making anything yet.

    Raises:
        OutputError: the nearest folder that exists cannot be written, or ``out_dir`` holds
            files already (and not ``overwrite``): findings never replace findings unasked.
    """
    out_dir = Path(out_dir)
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write to out_dir={str(out_dir)!r} ({str(existing)!r} is not "
                          "a writable folder); choose a writable out_dir")
    held = sorted(p.name for p in out_dir.iterdir()) if existing == out_dir else []
    if held and not overwrite:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise OutputError(f"out_dir={str(out_dir)!r} holds earlier findings ({shown}); choose "
                          "another out_dir, or set overwrite=true to replace them")
    return out_dir


@contextmanager
def writing(out_dir: str | Path) -> Iterator[Path]:
    """``out_dir``, made if needed, for the block that writes into it.

    Raises:
        OutputError: it cannot be written.
    """
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        yield out_dir
    except OSError as err:
        raise OutputError(f"cannot write to out_dir={str(out_dir)!r} ({err.strerror or err}); "
                          "choose a writable out_dir") from None


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping]) -> Path:
    """A CSV file of ``rows`` (their ``columns``, a header first)."""
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as text, each column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)
