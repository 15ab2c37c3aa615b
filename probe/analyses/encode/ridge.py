"""Cross-validated ridge regression with a penalty chosen per target by an inner search, solved
two ways that give the same numbers: by himalaya where the rows fit in memory, and from sums
streamed over the rows where they do not.

The scheme (both ways): the rows are dealt into ``k`` folds (seeded). For each outer fold f,
the model is trained on the other folds; each target's alpha is the one whose mean validation
score over the inner splits is best, the inner splits being the k - 1 other folds in turn
(train on k - 2, validate on one). The score of an inner split is the negative mean squared
error (himalaya's ``l2_neg_loss``); ties go to the larger alpha (``+ 1e-10 log alpha``, as
himalaya breaks them). Features and targets are centred by the training rows' means
(``fit_intercept``). The outer fold's held-out Pearson r of each target is its result.

Streamed, each fold contributes its sums (``FoldSums``): the count, Σx, Σy, Σy², XᵀX and XᵀY
(about the first block's mean). Any union of folds is then a sum of sums, its centred XᵀX is
diagonalised once for every alpha, and the validation errors and correlations follow from
the held-out fold's own sums: no row is read twice.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from probe.errors import ConfigError

__all__ = ["deal_folds", "FoldSums", "FoldAccumulator", "solve_streamed", "solve_in_memory",
           "symmetric_eigh", "inner_splits",
           "pearson_columns", "have_himalaya", "himalaya_bytes", "check_folds", "stats_bytes"]


def deal_folds(num_rows: int, folds: int, seed: int, contiguous: bool = False) -> np.ndarray:
    """Each row's outer fold (0 .. folds - 1), dealt from a permutation seeded by ``seed``;
    ``contiguous``: in runs of consecutive rows, for a time series, whose neighbouring rows
    are alike (a random deal would test on the neighbours of training rows)."""
    order = (np.arange(num_rows) if contiguous
             else np.random.default_rng(seed).permutation(num_rows))
    fold_of = np.empty(num_rows, dtype=np.int64)
    for fold, rows in enumerate(np.array_split(order, folds)):
        fold_of[rows] = fold
    return fold_of


@dataclass
class FoldSums:
    """Sums over one fold's rows of x (p features) and y (V targets), both shifted."""

    n: int
    sx: torch.Tensor   # (p,)
    sy: torch.Tensor   # (V,)
    syy: torch.Tensor  # (V,)
    xx: torch.Tensor   # (p, p)
    xy: torch.Tensor   # (p, V)


class FoldAccumulator:
    """Per-fold sums, added block by block: ``sums = FoldAccumulator(k)``, then
    ``sums.add(x, y, fold_of_each_row)`` per block, then ``sums.folds``."""

    def __init__(self, folds: int):
        self.num_folds = folds
        self.folds: list[FoldSums] = []
        self.shift: tuple[torch.Tensor, torch.Tensor] | None = None

    def add(self, x: torch.Tensor, y: torch.Tensor, fold_of: np.ndarray) -> None:
        if self.shift is None:  # sums about the first block's means stay small
            self.shift = (x.mean(0), y.mean(0))
            self.folds = [_zeros(x.shape[1], y.shape[1], x.device) for _ in range(self.num_folds)]
        x, y = x - self.shift[0], y - self.shift[1]
        fold_of = torch.as_tensor(fold_of, device=x.device)
        for fold in torch.unique(fold_of).tolist():
            rows = fold_of == fold
            xf, yf, sums = x[rows], y[rows], self.folds[fold]
            sums.n += len(xf)
            sums.sx += xf.sum(0)
            sums.sy += yf.sum(0)
            sums.syy += (yf * yf).sum(0)
            sums.xx.addmm_(xf.T, xf)  # in place: no p x p product made and freed a block
            sums.xy.addmm_(xf.T, yf)


def _zeros(p: int, v: int, device) -> FoldSums:
    def zeros(*shape):
        return torch.zeros(*shape, dtype=torch.float64, device=device)
    return FoldSums(0, zeros(p), zeros(v), zeros(v), zeros(p, p), zeros(p, v))


@dataclass
class _Fit:
    """Ridge on a union of folds, for every alpha: coefficients ``Q (M / (lam + alpha))``."""

    mx: torch.Tensor
    my: torch.Tensor
    lam: torch.Tensor
    q: torch.Tensor
    m: torch.Tensor


def _fit(folds: list[FoldSums], excluded: set[int]) -> _Fit:
    parts = [s for g, s in enumerate(folds) if g not in excluded]
    n = sum(s.n for s in parts)
    sx, sy = sum(s.sx for s in parts), sum(s.sy for s in parts)
    mx, my = sx / n, sy / n
    cxx = sum(s.xx for s in parts) - n * torch.outer(mx, mx)
    cxy = sum(s.xy for s in parts) - n * torch.outer(mx, my)
    lam, q = symmetric_eigh(cxx)
    return _Fit(mx, my, lam.clamp_min(0), q, q.T @ cxy)


def symmetric_eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # On the CPU, numpy's LAPACK call is several times faster than torch's (0.15 s against
    # 0.6 s for 1000 x 1000 here), and this is the solver's largest cost. It runs on one BLAS
    # thread: OpenBLAS's threaded eigh, whose tridiagonal reduction is memory-bound, took 17x
    # longer on two threads than on one here (256 x 256: 125 ms against 7 ms; 2048: 9.5 s
    # against 1.7 s), and worse still on a busy machine.
    if matrix.device.type == "cpu":
        with one_blas_thread():
            lam, q = np.linalg.eigh(matrix.numpy())
        return torch.from_numpy(lam), torch.from_numpy(q)
    return torch.linalg.eigh(matrix)


_CONTROLLER: list = []  # threadpoolctl's view of the loaded BLAS libraries, made once


def one_blas_thread():
    """A context in which numpy's BLAS and LAPACK run on one thread (threadpoolctl, which
    scikit-learn brings; without it, a context that changes nothing)."""
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            return nullcontext()
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")


@dataclass
class _HeldOut:
    """A fold's rows about a fit's means, in the fit's eigenbasis: Σaaᵀ, Σacᵀ, Σa, Σc, Σc²
    with a = x - mx, c = y - my."""

    n: int
    aa: torch.Tensor
    ac: torch.Tensor
    a: torch.Tensor
    c: torch.Tensor
    cc: torch.Tensor

    def moments(self, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For coefficients ``b`` (p, V) in the eigenbasis, the sums over the fold of the
        centred prediction u = a b: Σu, Σu², Σuc, one per target."""
        return self.a @ b, ((self.aa @ b) * b).sum(0), (self.ac * b).sum(0)


def _held_out(fit: _Fit, s: FoldSums) -> _HeldOut:
    mx, my, q = fit.mx, fit.my, fit.q
    aa = s.xx - torch.outer(s.sx, mx) - torch.outer(mx, s.sx) + s.n * torch.outer(mx, mx)
    ac = s.xy - torch.outer(s.sx, my) - torch.outer(mx, s.sy) + s.n * torch.outer(mx, my)
    return _HeldOut(s.n, q.T @ aa @ q, q.T @ ac, q.T @ (s.sx - s.n * mx), s.sy - s.n * my,
                    s.syy - 2 * my * s.sy + s.n * my * my)


def solve_streamed(folds: list[FoldSums], alphas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The outer folds' held-out Pearson r and chosen alphas from the folds' sums.

    Returns:
        ``(r, alpha)``, each (folds, V).
    """
    k = len(folds)
    grid = torch.tensor(alphas, dtype=torch.float64, device=folds[0].xx.device)
    scores = torch.zeros(k, len(alphas), folds[0].xy.shape[1], dtype=torch.float64,
                         device=grid.device)
    for f in range(k):
        for g in range(f + 1, k):
            fit = _fit(folds, {f, g})  # trained on all but f and g: validates on either
            for outer, inner in ((f, g), (g, f)):
                held = _held_out(fit, folds[inner])
                for i, alpha in enumerate(grid):
                    su, suu, suc = held.moments(fit.m / (fit.lam + alpha)[:, None])
                    scores[outer, i] -= (held.cc - 2 * suc + suu) / held.n
    chosen = (scores / (k - 1) + 1e-10 * torch.log(grid)[None, :, None]).argmax(1)
    r = torch.zeros(k, scores.shape[2], dtype=torch.float64, device=grid.device)
    for f in range(k):
        fit = _fit(folds, {f})
        held = _held_out(fit, folds[f])
        su, suu, suc = held.moments(fit.m / (fit.lam[:, None] + grid[chosen[f]][None, :]))
        r[f] = _pearson_from_sums(held.n, su, suu, suc, held.c, held.cc)
    return r.cpu().numpy(), grid[chosen].cpu().numpy()


def _pearson_from_sums(n: int, su, suu, suc, sc, scc) -> torch.Tensor:
    covariance = suc - su * sc / n
    variance = (suu - su * su / n) * (scc - sc * sc / n)
    defined = variance > 0
    return torch.where(defined, covariance / variance.clamp_min(1e-300).sqrt(),
                       torch.zeros_like(covariance))


def pearson_columns(prediction: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The Pearson r of each column of two (n, V) arrays; 0 where either is constant."""
    u = prediction - prediction.mean(0)
    c = target - target.mean(0)
    variance = (u * u).sum(0) * (c * c).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (u * c).sum(0) / np.sqrt(variance)
    return np.where(variance > 0, r, 0.0)


def have_himalaya() -> bool:
    import importlib.util

    return importlib.util.find_spec("himalaya") is not None


def solve_in_memory(x: torch.Tensor, y: np.ndarray, fold_of: np.ndarray,
                    alphas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The same scheme as ``solve_streamed`` by himalaya's ``RidgeCV``, on rows in memory:
    ``x`` (n, p) float64 on the analysis device, ``y`` (n, V).

    Raises:
        ConfigError: himalaya is not installed.
    """
    try:
        from himalaya.backend import get_backend, set_backend
        from himalaya.ridge import RidgeCV
    except ImportError:
        raise ConfigError("solver=himalaya needs himalaya: pip install 'probe[analysis]', or "
                          "use solver=streamed") from None
    k = int(fold_of.max()) + 1
    members = [np.flatnonzero(fold_of == g) for g in range(k)]
    r, chosen = np.zeros((k, y.shape[1])), np.zeros((k, y.shape[1]))
    previous = get_backend()
    backend = set_backend("torch_cuda" if x.device.type == "cuda" else "torch")
    here = torch.cuda.device(x.device) if x.device.type == "cuda" else nullcontext()
    try:
        with here:
            for f in range(k):
                train, inner = inner_splits(members, f)
                # one alpha at a time: its (validation x training rows) matrix is the largest
                model = RidgeCV(alphas=np.asarray(alphas, dtype=np.float64), fit_intercept=True,
                                cv=inner, solver_params={"warn": False, "n_alphas_batch": 1})
                model.fit(x[torch.as_tensor(train, device=x.device)], y[train])
                test = torch.as_tensor(members[f], device=x.device)
                prediction = np.asarray(backend.to_numpy(model.predict(x[test])))
                r[f] = pearson_columns(prediction.reshape(len(members[f]), -1), y[members[f]])
                chosen[f] = _on_grid(np.asarray(backend.to_numpy(model.best_alphas_)), alphas)
    finally:
        set_backend(previous)
    return r, chosen


def inner_splits(members: list[np.ndarray], outer: int
                 ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The training rows of outer fold ``outer`` (every other fold's ``members``, in order),
    and the inner splits over them as scikit-learn's ``cv`` takes them: each other fold held
    out in turn, as positions in those training rows."""
    others = [g for g in range(len(members)) if g != outer]
    train = np.concatenate([members[g] for g in others])
    starts = np.cumsum([0] + [len(members[g]) for g in others])
    positions = np.arange(len(train))
    return train, [(np.setdiff1d(positions, positions[a:b]), positions[a:b])
                   for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _on_grid(found: np.ndarray, alphas: list[float]) -> np.ndarray:
    # himalaya returns exp(-log(alpha)), a rounding away from the value given
    grid = np.asarray(alphas, dtype=np.float64)
    return grid[np.abs(np.log(found)[:, None] - np.log(grid)[None, :]).argmin(1)]


def check_folds(folds: int, num_rows: int) -> None:
    """Raises ConfigError for too few folds, or more folds than the rows can fill."""
    if int(folds) < 3:
        raise ConfigError(f"folds={folds} must be at least 3: each outer fold's alpha is "
                          "chosen by an inner search over the other folds, which needs two")
    if num_rows < 2 * int(folds):
        raise ConfigError(f"folds={folds} needs at least {2 * int(folds)} rows (two per fold "
                          f"for a correlation), and the file has {num_rows}")


def himalaya_bytes(rows: int, features: int, columns: int, folds: int) -> int:
    """About the most memory ``solve_in_memory`` holds (float64): the rows and their centred
    copies, and for one inner split and one alpha the SVD of the training rows, the
    resolution matrix and its (validation x training rows) product."""
    train = rows * (folds - 2) // folds
    held = rows // folds + 1
    return 8 * (3 * rows * (features + columns) + train * min(train, features)
                + 2 * features * train + held * train + held * columns)


def stats_bytes(folds: int, features: int, columns: int) -> int:
    """The bytes of the folds' sums (float64): k (p² + p V + 2p + 3V)."""
    return 8 * folds * (features * features + features * columns + 2 * features + 3 * columns)
