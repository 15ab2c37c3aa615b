"""The design matrix of an encoding model: the rows the ridge reads, one per target row.

Three kinds, one interface (``Design``: ``num_rows``, ``features``, ``read(start, stop)``):

- ``FileRows``: a key's stored rows (projected where they are too wide), one per sample; the
  targets' row of each is the sample's ``/index``.
- ``TRBins``: for naturalistic designs (``tr=``), the stored rows placed in time (by
  probe.analyses.encode.times) and averaged into the recording's TRs, each row into a TR of
  its own run (probe.analyses.encode.runs: a file's rows into that file's TRs). A TR that no
  row falls in is zeros. Row k is TR k, the targets' row k.
- ``Delayed``: a finite impulse response over another design, in time order: row t holds the
  rows t - d for each delay d (zeros before the first row of t's run), side by side.

The HRF's convolution (``Convolved``) is a design too, in probe.analyses.encode.hrf.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from probe.analyses.encode.projection import SparseProjection
from probe.analyses.encode.runs import Runs
from probe.analyses.encode.times import row_times
from probe.analyses.stats import AlignedRows, blocks_of
from probe.errors import ConfigError
from probe.file.read import FeatureFile

__all__ = ["Design", "FileRows", "TRBins", "Delayed", "checked_delays", "row_times",
           "check_time_series"]

log = logging.getLogger(__name__)


class Design(Protocol):
    num_rows: int
    features: int
    index: np.ndarray | None  # the targets' row of each design row
    row_bytes: int  # bytes held per row while a block is read

    def read(self, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop``, (stop - start, features) float64."""
        ...


class FileRows:
    """A key's stored rows in the order ``rows`` (positions in the file), projected by
    ``projection`` where one is given."""

    def __init__(self, f: FeatureFile, key: str, rows: np.ndarray, device: torch.device,
                 projection: SparseProjection | None):
        self.reader = AlignedRows({key: (f, key)}, {key: rows}, device)
        self.key, self.projection = key, projection
        self.num_rows = self.reader.num_rows
        width = self.reader.width(key)
        self.features = projection.components if projection is not None else width
        # rows per token have no target row of their own (TRBins places them in time)
        self.index = None if f.per_token(key) else f.index[rows]
        self.row_bytes = 16 * width + 8 * self.features  # the raw rows, their float64 copy

    def read(self, start: int, stop: int) -> torch.Tensor:
        x = self.reader.read(start, stop, [self.key])[self.key]
        return self.projection(x) if self.projection is not None else x


class TRBins:
    """The rows of ``source`` at ``times`` (seconds, one per row), averaged into ``num_trs``
    bins of ``tr`` seconds; held in memory (TRs x features). With ``runs``, row i's time is
    from the start of its run ``run_of[i]``, and TR k of that run is the targets' row
    ``runs.starts[run] + k``; without, every row is in one run of ``num_trs`` TRs.

    Raises:
        ConfigError: a row outside its run's TRs, every row in one TR, or more than the
            budget to hold.
    """

    def __init__(self, source: FileRows, times: np.ndarray, tr: float, num_trs: int,
                 budget: int, runs: Runs | None = None, run_of: np.ndarray | None = None):
        need = 8 * num_trs * source.features
        if need > budget:
            raise ConfigError(
                f"{num_trs} TRs x {source.features} features of {source.key} take "
                f"{need / (1 << 20):.0f} MiB; raise memory_mb or lower max_features")
        runs = runs if runs is not None else Runs.one(num_trs)
        run_of = run_of if run_of is not None else np.zeros(len(times), dtype=np.int64)
        bins = _bins(source.key, times, tr, runs, run_of)
        sums = torch.zeros(num_trs, source.features, dtype=torch.float64,
                           device=source.reader.device)
        rows = max(1, (budget // 4) // source.row_bytes)
        for start, stop in blocks_of(source.num_rows, rows):
            where = torch.as_tensor(bins[start:stop], device=sums.device)
            sums.index_add_(0, where, source.read(start, stop))
        counts = np.bincount(bins, minlength=num_trs)
        empty = int((counts == 0).sum())
        if empty:
            log.info("%s: %d of %d TRs hold no row (zeros there)", source.key, empty, num_trs)
        self.matrix = sums / torch.as_tensor(np.maximum(counts, 1), device=sums.device,
                                             dtype=torch.float64)[:, None]
        self.num_rows, self.features = num_trs, source.features
        self.index = np.arange(num_trs)
        self.row_bytes = 8 * source.features

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.matrix[start:stop]


def _bins(key: str, times: np.ndarray, tr: float, runs: Runs, run_of: np.ndarray
          ) -> np.ndarray:
    # each row's TR (the targets' row), once the times are known to lie in their runs and to
    # span more than one TR
    within = np.floor(times / tr).astype(np.int64)
    lengths = runs.lengths[run_of]
    outside = (times < 0) | (times >= lengths * tr) | (within >= lengths)
    if outside.any():
        late = np.where(outside, times - lengths * tr, -np.inf)
        i = int(np.argmin(times)) if times.min() < 0 else int(np.argmax(late))
        run, trs = int(run_of[i]), int(lengths[i])
        where = ("outside the recording: " if len(runs.names) == 1 else
                 f"in run {runs.names[run]!r} outside its recording: its ")
        raise ConfigError(f"a row of {key} lies at {times[i]:g} s, {where}{trs} TRs of "
                          f"tr={tr:g} s cover 0 to {trs * tr:g} s; check the onsets' units "
                          f"(seconds) and tr{'' if len(runs.names) == 1 else ' and runs='}")
    bins = runs.starts[run_of] + within
    if len(times) > 1 and bins.min() == bins.max():
        raise ConfigError(f"every row of {key} falls in one TR: tr={tr:g} s is longer than "
                          f"the stimulus (its rows span {times.max() - times.min():g} s); give "
                          "tr in seconds")
    return bins


class Delayed:
    """``source`` (rows in time order) with its rows t - d beside row t, one per delay; zeros
    where t - d lies before ``first_row[t]``, the first row of t's run (default: row 0)."""

    def __init__(self, source: Design, delays: list[int], first_row: np.ndarray | None = None):
        self.source, self.delays = source, delays
        self.first_row = (np.zeros(source.num_rows, dtype=np.int64) if first_row is None
                          else np.asarray(first_row, dtype=np.int64))
        self.num_rows, self.index = source.num_rows, source.index
        self.features = source.features * len(delays)
        self.row_bytes = source.row_bytes + 8 * self.features

    def read(self, start: int, stop: int) -> torch.Tensor:
        first = max(0, start - max(self.delays))
        x = self.source.read(first, stop)
        out = x.new_zeros(stop - start, self.features)
        width = self.source.features
        t = np.arange(start, stop)
        for j, d in enumerate(self.delays):
            # row t takes source row t - d where that is in t's run (a response never reaches
            # back into the run before)
            rows = t[t - d >= self.first_row[start:stop]]
            if len(rows):
                at = torch.as_tensor(rows - start, device=x.device)
                out[at, j * width:(j + 1) * width] = x[at + (start - d - first)]
        return out


def checked_delays(delays) -> list[int]:
    """``delays`` as whole TRs, at least 0, each once.

    Raises:
        ConfigError: empty, negative or not whole numbers.
    """
    values = list(delays)
    if not values or any(float(d) != int(d) or int(d) < 0 for d in values):
        raise ConfigError(f"delays={values} must be whole numbers of TRs (rows), 0 or more, "
                          "e.g. 'delays=[1,2,3,4]'")
    return sorted({int(d) for d in values})


def check_time_series(f: FeatureFile, key: str) -> np.ndarray:
    """The file's rows in sample order, for delays over samples: every sample 0 .. N - 1 must
    be there, once, each the next moment of the series.

    Raises:
        ConfigError: samples are missing, or the key holds rows per token.
    """
    if f.per_token(key):
        raise ConfigError(f"{key} holds one row per token; delays over its rows need "
                          "tr= (and onsets=, where the file has no /onset) to place them in "
                          "time")
    index = f.index
    order = np.argsort(index, kind="stable")
    if not np.array_equal(index[order], np.arange(len(index))):
        raise ConfigError(
            f"delays need every sample of the time series, and {str(f.path)!r} holds "
            f"{len(index)} samples with gaps (the highest is {int(index.max())}); run probe "
            "on the whole dataset, or merge every shard first")
    return order
