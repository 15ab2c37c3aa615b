"""Where reduce=pca|srp's projections come from: a sparse random matrix drawn from a seed
(srp), or principal axes fitted on rows computed before the run (pca).

    draw_srp(width, components, seed)         Achlioptas/Li: as scikit-learn's
                                              SparseRandomProjection(density="auto")
    fit = PcaFit(width, components); fit.add(rows) ...; fit.projection()

pca's fit is exact up to float64 rounding and never holds the rows: it sums them and their
Gram matrix X^T X (D x D) as they come, then takes the top eigenvectors of the covariance. A
row wider than ``GRAM_LIMIT`` values would make that matrix too large: such rows are held
(up to ``HELD_BYTES``) and decomposed by an SVD.
"""

from __future__ import annotations

import math
import zlib

import torch

from probe.errors import ConfigError
from probe.pipeline.compact.projections import Projection

__all__ = ["draw_srp", "PcaFit", "GRAM_LIMIT", "HELD_BYTES"]

GRAM_LIMIT = 8192  # the widest row whose D x D float64 Gram matrix (512 MiB) the fit keeps
HELD_BYTES = 2 << 30  # the float32 fit rows held at most where rows are wider than that


def draw_srp(key: str, width: int, components: int, seed: int) -> Projection:
    """The sparse random projection of ``key``'s rows: (K, D) entries +-sqrt(s / K) with
    probability 1 / (2 s) each, else 0, s = sqrt(D) (density 1 / sqrt(D), Li et al. 2006);
    drawn from ``seed`` and the key's name, so that every shard of a sweep draws the same."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(key.encode()))
    density = 1 / math.sqrt(width)
    kept = torch.rand(components, width, generator=generator) < density
    sign = torch.randint(0, 2, (components, width), generator=generator) * 2 - 1
    matrix = kept * sign * math.sqrt(1 / density) / math.sqrt(components)
    return Projection("srp", torch.zeros(width), matrix.float(),
                      attrs={"method": "srp", "density": density, "seed": int(seed)})


class PcaFit:
    """Principal axes of rows of ``width`` values, fitted as the rows come (see the module)."""

    def __init__(self, key: str, width: int, components: int):
        self.key, self.width, self.components = key, width, components
        self.rows, self.samples = 0, 0
        self._sum = torch.zeros(width, dtype=torch.float64)
        gram = width <= GRAM_LIMIT
        self._gram = torch.zeros(width, width, dtype=torch.float64) if gram else None
        self._held: list[torch.Tensor] | None = None if gram else []

    def add(self, rows: torch.Tensor, samples: int) -> None:
        """Rows (first axis) of ``samples`` samples, flattened to ``width`` values each."""
        rows = rows.reshape(len(rows), self.width)
        self.rows += len(rows)
        self.samples += samples
        if self._held is not None:
            if 4 * self.rows * self.width > HELD_BYTES:
                raise ConfigError(
                    f"reduce=pca on {self.key}: rows of {self.width} values over "
                    f"{self.samples} fit samples exceed {HELD_BYTES >> 30} GiB; lower "
                    "reduce_fit_samples, reduce the rows first (reduce=mean), or use reduce=srp")
            self._held.append(rows.float().clone())
            return
        rows = rows.double()
        self._sum += rows.sum(0)
        self._gram.addmm_(rows.T, rows)

    def projection(self) -> Projection:
        """The fitted projection on the top ``components`` axes, each signed so that its
        largest entry is positive (scikit-learn's choice).

        Raises:
            ConfigError: fewer fit rows than components (or than two).
        """
        if self.rows < max(2, self.components):
            raise ConfigError(
                f"reduce=pca on {self.key}: {self.rows} fit rows from {self.samples} samples "
                f"cannot give {self.components} components; raise reduce_fit_samples, or lower "
                "reduce_components")
        if self._held is not None:
            rows = torch.cat(self._held).double()
            mean = rows.mean(0)
            _, values, axes = torch.linalg.svd(rows - mean, full_matrices=False)
            variances = values ** 2 / (self.rows - 1)
            total = variances.sum()
        else:
            mean = self._sum / self.rows
            covariance = (self._gram - self.rows * torch.outer(mean, mean)) / (self.rows - 1)
            variances, vectors = torch.linalg.eigh(covariance)
            variances, axes = variances.flip(0).clamp_min(0), vectors.T.flip(0)
            total = covariance.diagonal().sum()
        axes = axes[:self.components]
        largest = axes.abs().argmax(1)
        axes = axes * torch.sign(axes[torch.arange(len(axes)), largest])[:, None]
        kept = variances[:self.components]
        ratio = min(1.0, float(kept.sum() / total)) if total > 0 else 1.0  # rounding: <= 1
        return Projection("pca", mean.float(), axes.float(), kept.float(),
                          attrs={"method": "pca", "fit_samples": self.samples,
                                 "fit_rows": self.rows, "explained_variance_ratio": ratio})
