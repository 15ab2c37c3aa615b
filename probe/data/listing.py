"""Datasets of files, listed two ways (sound clips, videos): a folder of class subfolders, or
a .csv/.jsonl list with a column of paths.

- ``listed_in_folder``: one subfolder per class, as ``dataset=imagefolder``; the targets are
  the class indices (sorted names), the names the root attr ``classes``; a folder without
  subfolders gives its own files, without classes;
- ``listed_in_file``: a .csv or .jsonl file with a column of paths (relative to the file's
  folder, or absolute) and, optionally, a column of labels (integers, or names numbered in
  sorted order) and columns of text.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from probe.errors import ConfigError, DataError

__all__ = ["Listing", "listed", "listed_in_folder", "listed_in_file", "relative"]

LISTS = (".csv", ".jsonl")


@dataclass
class Listing:
    """Files, their folder, their targets (None: no classes) and class names, and the text
    columns asked for, by column."""

    base: Path
    paths: list[Path]
    targets: np.ndarray | None = None
    classes: list[str] | None = None
    texts: dict[str, list[str]] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """Each file relative to the listing's folder (absolute where it lies elsewhere)."""
        return [relative(p, self.base) for p in self.paths]


def listed(kind: str, root: str | None, path: str | None, suffixes: tuple[str, ...],
           column: str, label_column: str | None, text_columns: dict[str, str | None],
           what: str, unit: str) -> Listing:
    """The files of ``dataset=<kind>``: those of the folder ``root`` (``listed_in_folder``)
    or those the list ``path`` names (``listed_in_file``), exactly one of the two given.

    Raises:
        ConfigError: neither or both of root and path; and what the two raise.
    """
    if (root is None) == (path is None):
        raise ConfigError(f"dataset={kind} needs one of dataset.root (a folder of files, or of "
                          "one subfolder per class) or dataset.path (a .csv or .jsonl list of "
                          "files)")
    if root is not None:
        return listed_in_folder(Path(root).expanduser(), suffixes, what)
    return listed_in_file(Path(path).expanduser(), str(column),
                          None if label_column is None else str(label_column),
                          {k: None if v is None else str(v) for k, v in text_columns.items()},
                          unit)


def listed_in_folder(root: Path, suffixes: tuple[str, ...], what: str) -> Listing:
    """The files of ``root``'s class subfolders whose suffix is one of ``suffixes``
    (``what``: the files, in messages: "sound files"); or, for a folder without subfolders,
    its own such files, without classes (a folder of films).

    Raises:
        DataError: no such folder, or no such files in it or in its class subfolders.
    """
    if not root.is_dir():
        raise DataError(f"dataset.root={str(root)!r}: no such folder")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        flat = sorted(p for p in root.iterdir() if p.suffix.lower() in suffixes)
        if flat:
            return Listing(root, flat)
        raise DataError(f"dataset.root={str(root)!r} has no class subfolders and no {what} of "
                        "its own; put the files in it (each class's in root/<class>/), or list "
                        "them in a csv with dataset.path")
    paths, targets = [], []
    for target, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in suffixes)
        paths += found
        targets += [target] * len(found)
    if not paths:
        raise DataError(f"dataset.root={str(root)!r} holds no {what} ({', '.join(suffixes)})")
    return Listing(root, paths, np.asarray(targets, dtype=np.int64), classes)


def listed_in_file(path: Path, column: str, label_column: str | None,
                   text_columns: dict[str, str | None], what: str) -> Listing:
    """The files that ``path`` (.csv or .jsonl) lists in ``column``, their labels
    (``label_column``) and the text of each ``text_columns`` (option name -> column; None:
    not asked). ``what`` names the listed things in messages ("clips").

    Raises:
        DataError: no such file, a file of another kind, no rows, a line that is not JSON.
        ConfigError: a column it does not have, empty labels.
    """
    if not path.is_file():
        raise DataError(f"dataset.path={str(path)!r}: no such file")
    if path.suffix.lower() not in LISTS:
        kind = path.suffix or "a file without a suffix"
        raise DataError(f"dataset.path={str(path)!r}: cannot read {kind}; list the {what} in "
                        "a .csv or .jsonl file, or pass a folder of class subfolders as "
                        "dataset.root")
    rows = _rows(path)
    if not rows:
        raise DataError(f"dataset.path={str(path)!r} lists no {what} (empty)")
    for key, name in (("column", column), ("label_column", label_column), *text_columns.items()):
        if name is not None and name not in rows[0]:
            raise ConfigError(f"dataset.{key}={name!r} is not a column of {str(path)!r}; it has "
                              f"{', '.join(map(str, rows[0]))}")
    paths = [Path(str(row.get(column, ""))).expanduser() for row in rows]
    paths = [p if p.is_absolute() else path.parent / p for p in paths]
    texts = {name: ["" if row.get(name) is None else str(row[name]) for row in rows]
             for name in text_columns.values() if name is not None}
    if label_column is None:
        return Listing(path.parent, paths, texts=texts)
    targets, classes = _labels([row.get(label_column) for row in rows], label_column, what)
    return Listing(path.parent, paths, targets, classes, texts)


def relative(path: Path, base: Path) -> str:
    """``path`` relative to ``base``, or as it is where it lies elsewhere."""
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _rows(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix.lower() == ".csv":
        return list(csv.DictReader(text.splitlines()))
    rows = []
    for n, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"dataset.path={str(path)!r}: line {n + 1} is not JSON ({err})"
                                "; fix the file") from None
    return rows


def _labels(values: list, column: str, what: str) -> tuple[np.ndarray, list[str] | None]:
    if any(v is None or v == "" for v in values):
        raise ConfigError(f"dataset.label_column={column!r} has empty values; give every "
                          f"{what.rstrip('s')} a label, or leave label_column unset")
    try:
        return np.asarray([int(v) for v in values], dtype=np.int64), None
    except (TypeError, ValueError):  # names of classes: numbered in sorted order
        classes = sorted({str(v) for v in values})
        number = {name: n for n, name in enumerate(classes)}
        return np.asarray([number[str(v)] for v in values], dtype=np.int64), classes
