"""The noise ceiling of an encoding model from repeated responses (``repeats=R.npy``, shape
(R, N, V): R presentations of the same N stimuli or TRs).

The repeats are split in two halves, the even and the odd ones; each target's split-half
reliability is the Pearson r between the two halves' means over the rows, corrected by
Spearman-Brown to the mean of all R repeats: ``rho = 2 r / (1 + r)``. A model that predicted
the true response perfectly would correlate with the mean of R noisy repeats at
``sqrt(rho)``: that is the ceiling, and ``r / sqrt(rho)`` the normalised score (undefined
where the reliability is not positive).
"""

from __future__ import annotations

import numpy as np

from probe.analyses.encode.ridge import pearson_columns
from probe.analyses.encode.targets import Targets, open_targets
from probe.analyses.stats import blocks_of
from probe.errors import ConfigError, DataError

__all__ = ["Repeats", "open_repeats", "normalised"]


class Repeats:
    """(R, N, V) repeated responses, read a block of target columns at a time."""

    def __init__(self, opened: Targets):
        self.opened, self.spec = opened, opened.spec
        shape = tuple(opened.array.shape)
        if len(shape) != 3 or shape[0] < 2:
            opened.close()
            raise ConfigError(f"repeats={self.spec!r} has shape {shape}; give (R, N, V): R >= 2 "
                              "repeats of the N rows of the V targets")
        self.num_repeats, self.num_rows = shape[0], shape[1]
        self.num_columns = shape[2]

    def close(self) -> None:
        self.opened.close()

    def _values(self, rows: np.ndarray | slice, c0: int, c1: int) -> np.ndarray:
        values = np.asarray(self.opened.array[:, rows, c0:c1], dtype=np.float64)
        if not np.isfinite(values).all():
            raise DataError(f"repeats={self.spec!r} holds NaN or an infinity; drop or fill "
                            "those values first")
        return values

    def mean(self, budget: int) -> np.ndarray:
        """The mean over the repeats, (N, V): the targets where none are given."""
        rows = slice(None)
        out = np.empty((self.num_rows, self.num_columns))
        for c0, c1 in blocks_of(self.num_columns, self._columns_per_block(budget)):
            out[:, c0:c1] = self._values(rows, c0, c1).mean(0)
        return out

    def reliability(self, rows: np.ndarray, budget: int) -> np.ndarray:
        """Each target's Spearman-Brown corrected split-half reliability over ``rows``."""
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        rho = np.empty(self.num_columns)
        for c0, c1 in blocks_of(self.num_columns, self._columns_per_block(budget, len(rows))):
            values = self._values(rows, c0, c1)
            r = pearson_columns(values[0::2].mean(0), values[1::2].mean(0))
            rho[c0:c1] = 2 * r / (1 + r)
        return rho

    def check_against(self, targets: Targets) -> None:
        """Raises ConfigError where the repeats are not repeats of these targets' rows."""
        if (self.num_rows, self.num_columns) != (targets.num_rows, targets.num_columns):
            raise ConfigError(
                f"repeats={self.spec!r} holds {self.num_rows} rows x {self.num_columns} "
                f"targets per repeat, and targets={targets.spec!r} {targets.num_rows} x "
                f"{targets.num_columns}; the repeats must be of the same rows and targets")

    def _columns_per_block(self, budget: int, rows: int | None = None) -> int:
        per_column = 16 * self.num_repeats * (rows or self.num_rows)
        return max(1, min(self.num_columns, budget // max(1, per_column)))


def open_repeats(spec: str) -> Repeats:
    """Open ``R.npy`` (memory-mapped) or ``R.h5:name`` of shape (R, N, V).

    Raises:
        ConfigError: not such an array. DataError: no such file.
    """
    return Repeats(open_targets(spec, option="repeats"))


def normalised(r: np.ndarray, reliability: np.ndarray) -> np.ndarray:
    """``r / sqrt(reliability)`` per target; NaN where the reliability is not positive."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(reliability > 0, r / np.sqrt(np.clip(reliability, 1e-300, None)),
                        np.nan)
