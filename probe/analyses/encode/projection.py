"""A seeded random projection for rows wider than ``max_features``.

The very sparse random projection of Li, Hastie and Church (2006), as scikit-learn's
``SparseRandomProjection`` makes it: each of the D x k entries is ``+-sqrt(s / k)`` with
probability ``1 / (2s)`` each and 0 otherwise, ``s = sqrt(D)``. Distances and inner products
between rows are kept in expectation (Johnson-Lindenstrauss), and the matrix holds about
``k sqrt(D)`` entries, so it fits in memory for any D.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["SparseProjection", "DESCRIPTION"]

DESCRIPTION = "very sparse random projection (Li, Hastie and Church 2006), density 1/sqrt(D)"


class SparseProjection:
    """``x @ R`` for a (D, k) sparse random matrix R fixed by ``seed``.

    Example::

        project = SparseProjection(100_000, 4096, seed=0, device=torch.device("cpu"))
        y = project(x)       # (B, 100000) -> (B, 4096)
    """

    def __init__(self, width: int, components: int, seed: int, device: torch.device):
        self.width, self.components, self.seed = int(width), int(components), int(seed)
        density = 1.0 / math.sqrt(self.width)
        rng = np.random.default_rng([self.seed, self.width, self.components])
        counts = rng.binomial(self.width, density, size=self.components)
        rows = np.concatenate([rng.choice(self.width, c, replace=False) for c in counts])
        cols = np.repeat(np.arange(self.components), counts)
        signs = rng.choice([-1.0, 1.0], size=len(rows))
        scale = math.sqrt(1.0 / density) / math.sqrt(self.components)
        # kept as Rᵀ (k, D): torch multiplies a sparse matrix by a dense one from the left
        self.transposed = torch.sparse_coo_tensor(
            torch.from_numpy(np.stack([cols, rows])), torch.from_numpy(signs * scale),
            (self.components, self.width), dtype=torch.float64,
            check_invariants=True).coalesce().to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.transposed, x.T).T

    def describe(self) -> dict:
        """What the output records about it."""
        return {"projection": DESCRIPTION, "input_features": self.width,
                "features": self.components, "projection_seed": self.seed}
