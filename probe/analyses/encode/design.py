"""The design matrix of an encoding model: the rows the ridge reads, one per target row.

Three kinds, one interface (``Design``: ``num_rows``, ``features``, ``read(start, stop)``):

- ``FileRows``: a key's stored rows (projected where they are too wide), one per sample; the
  targets' row of each is the sample's ``/index``.
- ``TRBins``: for naturalistic designs (``tr=``, ``onsets=``), the stored rows placed in time
  and averaged into the recording's TRs: a sample's row at its onset, a frame's at its sample's
  onset plus ``position / frame_rate``, or each stored row (a token, say) at its own onset. A
  TR that no row falls in is zeros. Row k is TR k, the targets' row k.
- ``Delayed``: a finite impulse response over another design, in time order: row t holds the
  rows t - d for each delay d (zeros before the first), side by side.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import torch

from probe.analyses.encode.projection import SparseProjection
from probe.analyses.stats import AlignedRows, blocks_of
from probe.errors import ConfigError
from probe.file.format import POSITIONS
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
    bins of ``tr`` seconds; held in memory (TRs x features).

    Raises:
        ConfigError: a row outside the recording, every row in one TR, or more than the
            budget to hold.
    """

    def __init__(self, source: FileRows, times: np.ndarray, tr: float, num_trs: int,
                 budget: int):
        need = 8 * num_trs * source.features
        if need > budget:
            raise ConfigError(
                f"{num_trs} TRs x {source.features} features of {source.key} take "
                f"{need / (1 << 20):.0f} MiB; raise memory_mb or lower max_features")
        bins = _bins(source.key, times, tr, num_trs)
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


def _bins(key: str, times: np.ndarray, tr: float, num_trs: int) -> np.ndarray:
    # each row's TR, once the times are known to lie in the recording and span more than one
    end = num_trs * tr
    if len(times) and (times.min() < 0 or times.max() >= end):
        bad = times.min() if times.min() < 0 else times.max()
        raise ConfigError(f"a row of {key} lies at {bad:g} s, outside the recording: "
                          f"{num_trs} TRs of tr={tr:g} s cover 0 to {end:g} s; check the "
                          "onsets' units (seconds) and tr")
    bins = np.floor(times / tr).astype(np.int64)
    if len(times) > 1 and bins.min() == bins.max():
        raise ConfigError(f"every row of {key} falls in one TR: tr={tr:g} s is longer than "
                          f"the stimulus (its rows span {times.max() - times.min():g} s); give "
                          "tr in seconds")
    return bins


class Delayed:
    """``source`` (rows in time order) with its rows t - d beside row t, one per delay."""

    def __init__(self, source: Design, delays: list[int]):
        self.source, self.delays = source, delays
        self.num_rows, self.index = source.num_rows, source.index
        self.features = source.features * len(delays)
        self.row_bytes = source.row_bytes + 8 * self.features

    def read(self, start: int, stop: int) -> torch.Tensor:
        first = max(0, start - max(self.delays))
        x = self.source.read(first, stop)
        out = x.new_zeros(stop - start, self.features)
        width = self.source.features
        for j, d in enumerate(self.delays):
            # row t takes source row t - d: rows from max(start, d) on
            begin = max(start, d)
            if begin < stop:
                out[begin - start:, j * width:(j + 1) * width] = x[begin - d - first:stop - d
                                                                    - first]
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
                          "tr= and onsets= to place them in time")
    index = f.index
    order = np.argsort(index, kind="stable")
    if not np.array_equal(index[order], np.arange(len(index))):
        raise ConfigError(
            f"delays need every sample of the time series, and {str(f.path)!r} holds "
            f"{len(index)} samples with gaps (the highest is {int(index.max())}); run probe "
            "on the whole dataset, or merge every shard first")
    return order


def row_times(f: FeatureFile, key: str, onsets: np.ndarray, option: str) -> np.ndarray:
    """When each stored row of ``key`` happened, in seconds: see the module's docstring.

    Raises:
        ConfigError: the onsets have neither a value per sample nor one per stored row, or
            they decrease, or frame rows in a file without a frame rate.
    """
    onsets = np.asarray(onsets, dtype=np.float64).reshape(-1)
    if not np.isfinite(onsets).all():
        raise ConfigError(f"{option} holds NaN or an infinity; give every onset in seconds")
    if not f.per_token(key):
        index = f.index
        if len(onsets) <= int(index.max()):
            raise ConfigError(f"{option} has {len(onsets)} onsets, but {str(f.path)!r} holds "
                              f"sample {int(index.max())}; give one onset per dataset sample")
        _check_increasing(onsets, option, "sample")
        return onsets[index]
    stored = int(f.offsets[-1])
    if len(onsets) == stored:  # one per stored row: a token's word onset, say
        _check_increasing(onsets, option, "row")
        return onsets
    if len(onsets) <= int(f.index.max()):
        raise ConfigError(f"{option} has {len(onsets)} onsets; {key} holds {stored} rows of "
                          f"{f.num_rows} samples: give one onset per dataset sample (frames are "
                          "placed by the frame rate) or one per stored row")
    rate = f.attrs.get("frame_rate")
    if rate is None:
        raise ConfigError(f"{option} has one onset per sample, but {key} holds rows per token "
                          "and the file has no frame rate to place them by; give one onset "
                          "per stored row")
    _check_increasing(onsets, option, "sample")
    offsets = f.offsets
    sample_of_row = np.repeat(f.index, np.diff(offsets))
    positions = f[POSITIONS][:stored] if POSITIONS in f else (
        np.arange(stored) - np.repeat(offsets[:-1], np.diff(offsets)))
    return onsets[sample_of_row] + positions / float(rate)


def _check_increasing(onsets: np.ndarray, option: str, unit: str) -> None:
    back = np.flatnonzero(np.diff(onsets) < 0)
    if len(back):
        i = int(back[0])
        raise ConfigError(f"{option}: the onset of {unit} {i + 1} ({onsets[i + 1]:g} s) comes "
                          f"before that of {unit} {i} ({onsets[i]:g} s); onsets must not "
                          "decrease")

