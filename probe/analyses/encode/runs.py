"""The runs of a naturalistic recording: one time series per stimulus file (a movie, a story, a
clip: one fMRI run), whose TRs are a block of consecutive rows of the targets.

    files = files_of(f)                          # the probe file's files, as they first appear
    runs = read_runs("runs.npy", files, 600)     # or Runs.one(600): every TR in one run
    runs.first_row                               # where delays and the HRF stop looking back
    fold_of, how = runs.fold_of(5)               # whole runs per fold, where there are 5 or more

``runs=R.npy`` gives each targets row's run: integers 0 .. F - 1, the files numbered in the
order they first appear in the dataset (the probe file's rows sorted by ``/index``), or their
names as ``/file`` holds them (a numpy unicode array; never a pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from probe.analyses.encode.ridge import deal_folds
from probe.errors import ConfigError, DataError
from probe.file.format import FILE
from probe.file.read import FeatureFile

__all__ = ["Files", "Runs", "files_of", "read_runs"]


@dataclass(frozen=True)
class Files:
    """The stimulus files of a probe file's rows: ``names`` in the order they first appear in
    the dataset (``()`` where the file has no ``/file``: its rows are one series), and each
    row's number in ``names`` (``of_row``, (N,))."""

    names: tuple[str, ...]
    of_row: np.ndarray
    path: str

    @property
    def count(self) -> int:
        return max(1, len(self.names))


def files_of(f: FeatureFile) -> Files:
    """The files of ``f``'s rows (``/file``), numbered in dataset order."""
    if FILE not in f:
        return Files((), np.zeros(f.num_rows, dtype=np.int64), str(f.path))
    values = np.asarray(f[FILE].asstr()[: f.num_rows], dtype=str)
    # a merged file holds its rows in shard order: the order of the files is the dataset's
    order = np.argsort(f.index, kind="stable")
    unique, first, inverse = np.unique(values[order], return_index=True, return_inverse=True)
    rank = np.empty(len(unique), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(unique))
    of_row = np.empty(len(values), dtype=np.int64)
    of_row[order] = rank[inverse]
    return Files(tuple(str(name) for name in unique[np.argsort(first, kind="stable")]), of_row,
                 str(f.path))


@dataclass(frozen=True)
class Runs:
    """Run r (the file ``names[r]``) holds the targets' rows ``starts[r]`` to ``starts[r] +
    lengths[r]``: its TRs, in order; ``of_row`` (num_rows,) is each targets row's run."""

    names: tuple[str, ...]
    starts: np.ndarray
    lengths: np.ndarray
    of_row: np.ndarray

    @classmethod
    def one(cls, num_rows: int, name: str = "") -> Runs:
        """Every targets row in one run."""
        return cls((name,), np.zeros(1, dtype=np.int64), np.array([num_rows]),
                   np.zeros(num_rows, dtype=np.int64))

    @property
    def num_rows(self) -> int:
        return len(self.of_row)

    @property
    def first_row(self) -> np.ndarray:
        """Each targets row's run's first row: no response reaches back before it."""
        return self.starts[self.of_row]

    def fold_of(self, folds: int) -> tuple[np.ndarray, str]:
        """Each targets row's outer fold, and how they were made (for the log): whole runs,
        consecutive in the targets, where there are at least ``folds`` runs (leave-runs-out:
        no fold tests on a run it trained on), else contiguous blocks of rows."""
        count = len(self.names)
        if count >= folds:
            fold_of_run = np.empty(count, dtype=np.int64)
            for fold, runs in enumerate(np.array_split(np.argsort(self.starts), folds)):
                fold_of_run[runs] = fold
            return fold_of_run[self.of_row], (f"{folds} folds of whole runs (leave-runs-out, "
                                              f"{count} runs)")
        how = f"{folds} folds of contiguous rows"
        return deal_folds(self.num_rows, folds, 0, contiguous=True), how + (
            f" ({count} runs, fewer than folds: a fold may span two)" if count > 1 else "")

    def describe(self) -> dict:
        """The runs in the targets' order, for the results: their files and TRs."""
        order = np.argsort(self.starts)
        return {"runs": [self.names[r] for r in order],
                "run_trs": [int(self.lengths[r]) for r in order]}


def read_runs(spec: str | Path, files: Files, num_rows: int) -> Runs:
    """``runs=R.npy``: each of the ``num_rows`` targets rows' run, as numbers or file names.

    Raises:
        ConfigError: not a .npy of integers or strings, another length than the targets,
            a number or name that is not one of the files, a run whose rows are not
            consecutive, or a file of the probe file that gets no TR.
        DataError: no such file.
    """
    spec = str(spec)
    number = _numbered(spec, _loaded(spec), files)
    if len(number) != num_rows:
        raise ConfigError(f"runs={spec!r} has {len(number)} entries, but the targets have "
                          f"{num_rows} rows (TRs); give one run per targets row")
    starts = np.flatnonzero(np.diff(number, prepend=-1) != 0)
    seen: set[int] = set()
    for start in starts:
        run = int(number[start])
        if run in seen:
            raise ConfigError(
                f"runs={spec!r}: run {_name(files, run)!r} comes back at targets row "
                f"{int(start)} after another run; each run's TRs must be consecutive rows of "
                "the targets")
        seen.add(run)
    missing = [r for r in range(files.count) if r not in seen]
    if missing:
        raise ConfigError(
            f"runs={spec!r} gives no TR to {_name(files, missing[0])!r}, whose rows "
            f"{files.path!r} holds ({len(missing)} such file(s)); give every file's run its "
            "TRs in the targets")
    run_starts = np.zeros(files.count, dtype=np.int64)
    run_starts[number[starts]] = starts
    lengths = np.bincount(number, minlength=files.count)
    names = files.names or ("",)
    return Runs(names, run_starts, lengths, number)


def _loaded(spec: str) -> np.ndarray:
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".npy":
        raise ConfigError(f"runs={spec!r}: use a .npy file, one run per targets row (integers, "
                          "or the files' names as a numpy str array)")
    if not path.is_file():
        raise DataError(f"runs={spec!r} does not exist; pass a .npy file of one run per "
                        "targets row")
    try:
        values = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise ConfigError(f"runs={spec!r} cannot be read without pickle ({err}); save the "
                          "names as np.array(names, dtype=str)") from None
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise ConfigError(f"runs={spec!r} has shape {values.shape}; give one run per targets "
                          "row, (N,)")
    return values


def _numbered(spec: str, values: np.ndarray, files: Files) -> np.ndarray:
    # each entry as the number of its file (files.names' order)
    if np.issubdtype(values.dtype, np.integer):
        bad = values[(values < 0) | (values >= files.count)]
        if len(bad):
            raise ConfigError(
                f"runs={spec!r} holds run {int(bad[0])}, but {files.path!r} holds rows of "
                f"{files.count} file(s); number the runs 0 to {files.count - 1} in the order "
                "their files first appear in the dataset, or name them as /file does")
        return values.astype(np.int64)
    if values.dtype.kind != "U":
        raise ConfigError(f"runs={spec!r} holds {values.dtype}; give integers (0 to "
                          f"{files.count - 1}) or the files' names (a numpy str array)")
    if not files.names:
        raise ConfigError(f"runs={spec!r} names runs by file, but {files.path!r} has no /file: "
                          "its rows are one run; leave runs= out, or give 0 for every row")
    number = {name: i for i, name in enumerate(files.names)}
    unknown = [name for name in dict.fromkeys(values.tolist()) if name not in number]
    if unknown:
        shown = ", ".join(repr(name) for name in files.names[:3])
        more = f" and {len(files.names) - 3} more" if len(files.names) > 3 else ""
        raise ConfigError(f"runs={spec!r} names {unknown[0]!r}, which is not a file of "
                          f"{files.path!r} (its rows are of {shown}{more}); name each run by "
                          "its /file, or number them 0 to "
                          f"{files.count - 1}")
    return np.array([number[name] for name in values.tolist()], dtype=np.int64)


def _name(files: Files, run: int) -> str:
    return files.names[run] if files.names else str(run)
