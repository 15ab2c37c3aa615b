"""The ridge scheme of probe.analyses.encode.ridge in its kernel form, for keys with more
features than rows.

Ridge with an intercept predicts ``(x - mx) B`` with ``B = (XcᵀXc + alpha I)⁻¹ XcᵀYc``; by the
push-through identity that is ``kᵀ (Kc + alpha I)⁻¹ Yc``, with ``Kc`` the training rows' centred
Gram matrix and ``k`` a row's centred products with them. Both come from the Gram matrix of
all rows, ``G = X Xᵀ`` (N x N), made once per key: centring by any union of folds is a few
means of G's blocks. Each fit (a union of folds) diagonalises its ``Kc`` once for every alpha
and every target, as the streamed solver diagonalises ``XcᵀXc``: an eigendecomposition of the
training rows' size rather than of the features'. The folds, the inner search and the ties are
the streamed solver's, and so are the numbers (to rounding).
"""

from __future__ import annotations

import numpy as np
import torch

from probe.analyses.encode.ridge import pearson_columns, symmetric_eigh

__all__ = ["solve_kernel", "kernel_bytes"]


class _KernelFit:
    """Ridge trained on the rows ``train`` of a Gram matrix, for every alpha at once."""

    def __init__(self, gram: torch.Tensor, y: torch.Tensor, train: torch.Tensor):
        g = gram[train][:, train]
        self.gram, self.train = gram, train
        self.row_mean = g.mean(1)  # x_t . mx
        self.total_mean = self.row_mean.mean()  # mx . mx
        g -= self.row_mean[:, None]
        g -= self.row_mean[None, :]
        g += self.total_mean
        lam, self.u = symmetric_eigh(g)
        del g
        self.lam = lam.clamp_min(0)
        self.my = y[train].mean(0)
        self.m = self.u.T @ (y[train] - self.my)  # (train, V), in the eigenbasis

    def basis(self, rows: torch.Tensor) -> torch.Tensor:
        """The centred products of ``rows`` with the training rows, in the eigenbasis."""
        k = self.gram[rows][:, self.train]
        k -= k.mean(1, keepdim=True)  # x_v . mx
        k -= self.row_mean[None, :]
        k += self.total_mean
        return k @ self.u

    def predict(self, basis: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """Predictions for the rows of ``basis`` with penalty ``alpha``: a scalar, or one per
        target (V,)."""
        weights = 1.0 / (self.lam[:, None] + alpha)
        return basis @ (self.m * weights) + self.my


def solve_kernel(gram: torch.Tensor, y: torch.Tensor, fold_of: np.ndarray,
                 alphas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The outer folds' held-out Pearson r and chosen alphas, as ``solve_streamed`` gives
    them, from the (N, N) Gram matrix of the rows and their (N, V) targets, float64.

    Returns:
        ``(r, alpha)``, each (folds, V).
    """
    k = int(fold_of.max()) + 1
    device = gram.device
    members = [torch.as_tensor(np.flatnonzero(fold_of == g), device=device) for g in range(k)]

    def rows_but(excluded: set[int]) -> torch.Tensor:
        return torch.cat([members[g] for g in range(k) if g not in excluded])

    grid = torch.tensor(alphas, dtype=torch.float64, device=device)
    scores = torch.zeros(k, len(alphas), y.shape[1], dtype=torch.float64, device=device)
    for f in range(k):
        for g in range(f + 1, k):
            fit = _KernelFit(gram, y, rows_but({f, g}))  # validates on either f or g
            for outer, inner in ((f, g), (g, f)):
                basis, truth = fit.basis(members[inner]), y[members[inner]]
                for i, alpha in enumerate(grid):
                    error = truth - fit.predict(basis, alpha)
                    scores[outer, i] -= (error * error).mean(0)
            del fit
    chosen = (scores / (k - 1) + 1e-10 * torch.log(grid)[None, :, None]).argmax(1)
    r = np.zeros((k, y.shape[1]))
    for f in range(k):
        fit = _KernelFit(gram, y, rows_but({f}))
        prediction = fit.predict(fit.basis(members[f]), grid[chosen[f]][None, :])
        r[f] = pearson_columns(prediction.cpu().numpy(), y[members[f]].cpu().numpy())
    return r, grid[chosen].cpu().numpy()


def kernel_bytes(rows: int, columns: int, folds: int) -> int:
    """About the most memory ``solve_kernel`` holds (float64): the Gram matrix, the targets,
    and for the largest fit its centred Gram, eigenvectors, and one fold's products."""
    train = rows - rows // folds
    held = rows // folds + 1
    return 8 * (rows * rows + 2 * rows * columns + 2 * train * train + 2 * held * train
                + train * columns)
