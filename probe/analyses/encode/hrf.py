"""The haemodynamic response (``hrf=spm|glover``): features binned into TRs, convolved with
nilearn's response function sampled at the TR, so that a row predicts the slow BOLD response
its stimulus causes rather than the stimulus itself.

    kernel = hrf_kernel("spm", tr=2.0)            # nilearn's spm_hrf(2.0, oversampling=1)
    design = Convolved(binned, kernel, runs.first_row, budget)

The convolution is causal (row t sums the kernel's lags over rows t, t - 1, ...) and stops at
its run's first row: one run's stimulus never leaks into the next run's responses.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

from probe.errors import ConfigError

__all__ = ["HRFS", "checked_hrf", "hrf_kernel", "Convolved"]

# each hrf= by the nilearn function that samples it (nilearn.glm.first_level)
HRFS = {"spm": "spm_hrf", "glover": "glover_hrf"}


def checked_hrf(hrf: str | None, tr: float | None) -> str | None:
    """``hrf`` as a known name, where a TR is given and nilearn is installed; None: none.

    Raises:
        ConfigError: an unknown name, no ``tr``, or no nilearn.
    """
    if hrf is None:
        return None
    name = str(hrf).lower()
    if name not in HRFS:
        raise ConfigError(f"hrf={hrf!r}: use {' or '.join(HRFS)} (nilearn's response "
                          "functions), or leave it out")
    if tr is None:
        raise ConfigError(f"hrf={name} convolves the rows binned into TRs, and needs tr=SECONDS "
                          "(the targets' rows are TRs)")
    if importlib.util.find_spec("nilearn") is None:
        raise ConfigError("hrf= needs nilearn: pip install 'probe[analysis]'")
    return name


def hrf_kernel(name: str, tr: float) -> np.ndarray:
    """nilearn's response function ``name`` sampled once per TR from the stimulus on (its
    32 s), as its own function gives it: ``spm_hrf(t_r=tr, oversampling=1)``.

    Raises:
        ConfigError: nilearn is not installed.
    """
    try:
        from nilearn.glm import first_level
    except ImportError:
        raise ConfigError("hrf= needs nilearn: pip install 'probe[analysis]'") from None
    return np.asarray(getattr(first_level, HRFS[name])(t_r=float(tr), oversampling=1),
                      dtype=np.float64)


class Convolved:
    """``source`` (TRs in time order) convolved with ``kernel`` within each run: row t is
    the sum over lags k of ``kernel[k] * source[t - k]``, for t - k not before
    ``first_row[t]``; held in memory (TRs x features).

    Raises:
        ConfigError: the convolved rows do not fit in the budget beside the source's.
    """

    def __init__(self, source, kernel: np.ndarray, first_row: np.ndarray, budget: int):
        n, features = source.num_rows, source.features
        need = 2 * 8 * n * features
        if need > budget:
            raise ConfigError(f"the HRF convolution holds {n} TRs x {features} features twice, "
                              f"{need / (1 << 20):.0f} MiB; raise memory_mb or lower "
                              "max_features")
        x = source.read(0, n)
        out = torch.zeros_like(x)
        t = np.arange(n)
        for lag, weight in enumerate(kernel.tolist()):
            rows = t[t - lag >= first_row]
            if weight != 0 and len(rows):
                where = torch.as_tensor(rows, device=x.device)
                out[where] += weight * x[where - lag]
        self.matrix = out
        self.num_rows, self.features, self.index = n, features, source.index
        self.row_bytes = 8 * features

    def read(self, start: int, stop: int) -> torch.Tensor:
        return self.matrix[start:stop]
