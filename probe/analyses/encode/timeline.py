"""Where a probe file's rows lie in the targets' TRs (``tr=``): their times (the file's
``/onset``, or ``onsets=`` by hand), their runs (one per ``/file``, each a block of the targets'
rows: ``runs=``), and what becomes of them there (averaged per TR, then convolved with the
haemodynamic response where ``hrf=`` asks).

    timeline = open_timeline(f, tr=2.0, onsets=None, runs="runs.npy", hrf="spm", num_trs=600)
    design = timeline.design(f, key, FileRows(...), budget)   # TRBins, or Convolved over it
    fold_of, how = timeline.runs.fold_of(5)

With the file's ``/onset``, each row's time is from the start of its ``/file``, and every file
is a run of its own: a file of several files needs ``runs=``. With ``onsets=`` by hand and no
``runs=``, the rows are one series as they always were (the onsets run through the whole
recording); with ``runs=``, each onset is from the start of its sample's file, as stored ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from probe.analyses.encode.design import Design, FileRows, TRBins
from probe.analyses.encode.hrf import Convolved, hrf_kernel
from probe.analyses.encode.runs import Runs, files_of, read_runs
from probe.analyses.encode.times import has_stored_onsets, row_times, stored_times
from probe.errors import ConfigError
from probe.file.read import FeatureFile

__all__ = ["Timeline", "open_timeline"]


@dataclass(frozen=True)
class Timeline:
    """How the rows of a file become the targets' TRs: ``tr`` seconds each, in ``runs``;
    ``sample_run`` is each file row's run; ``onsets`` the ones given by hand (None: the
    file's /onset); ``hrf`` a name of probe.analyses.encode.hrf.HRFS, or None."""

    tr: float
    runs: Runs
    sample_run: np.ndarray
    onsets: np.ndarray | None = None
    hrf: str | None = None
    onsets_from: str = "the file's /onset"

    def place(self, f: FeatureFile, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Each stored row of ``key``: its time in seconds (from its run's start) and its run.

        Raises:
            ConfigError: onsets by hand that do not fit the rows (probe.analyses.encode.times).
        """
        if self.onsets is None:
            times = stored_times(f, key)
        else:  # several runs restart their clocks: the onsets decrease between them
            times = row_times(f, key, self.onsets, "onsets", ordered=len(self.runs.names) == 1)
        run = (np.repeat(self.sample_run, np.diff(f.offsets)) if f.per_token(key)
               else self.sample_run)
        return times, run

    def design(self, f: FeatureFile, key: str, source: FileRows, budget: int) -> Design:
        """``source``'s rows averaged into the TRs, convolved with the HRF where asked."""
        times, run = self.place(f, key)
        binned = TRBins(source, times, self.tr, self.runs.num_rows, budget, self.runs, run)
        if self.hrf is None:
            return binned
        return Convolved(binned, hrf_kernel(self.hrf, self.tr), self.runs.first_row, budget)

    def describe(self) -> dict:
        """What the results record of it: tr, where the onsets came from, hrf, the runs."""
        found = {"tr": self.tr, "onsets": self.onsets_from, **self.runs.describe()}
        if self.hrf is not None:
            found["hrf"] = self.hrf
        return found


def open_timeline(f: FeatureFile, tr: float, onsets: np.ndarray | None, runs: str | Path | None,
                  hrf: str | None, num_trs: int, onsets_from: str = "") -> Timeline:
    """The timeline of ``f``'s rows in ``num_trs`` TRs of ``tr`` seconds.

    Args:
        onsets: each sample's (or stored row's) onset, given by hand; None: the file's.
        runs: ``R.npy``, each targets row's run (probe.analyses.encode.runs); None: one run,
            which a file of rows of several files cannot be without onsets by hand.
        hrf: a checked name (probe.analyses.encode.hrf.checked_hrf), or None.
        onsets_from: where ``onsets`` came from, for the results.

    Raises:
        ConfigError: no onsets at all, several files and no ``runs=``, or bad ``runs=``.
    """
    if onsets is None and not has_stored_onsets(f):
        raise ConfigError(
            f"tr={tr:g} places the rows by the file's /onset, and {str(f.path)!r} has none "
            "(tr= and onsets= go together here): give onsets=O.npy (each sample's onset in "
            "seconds), or capture a timed dataset (dataset=video, a word-timed story, audio)")
    files = files_of(f)
    if runs is not None:
        timeline_runs, sample_run = read_runs(runs, files, num_trs), files.of_row
    elif onsets is None and files.count > 1:
        raise ConfigError(
            f"{str(f.path)!r} holds rows of {files.count} files, each a run with a clock of "
            "its own; give runs=R.npy, each targets row's run: 0 to "
            f"{files.count - 1} in the order the files first appear, or their /file names")
    else:
        name = files.names[0] if len(files.names) == 1 else ""
        timeline_runs = Runs.one(num_trs, name)
        sample_run = np.zeros(f.num_rows, dtype=np.int64)
    return Timeline(float(tr), timeline_runs, sample_run, onsets, hrf,
                    onsets_from or "the file's /onset")
