"""Banded ridge across keys (``bands=[key_a,key_b]``): one model from several keys at once, each
key a band with a penalty of its own, by himalaya's multiple-kernel ridge.

Each band's rows give a linear kernel (their Gram matrix, made as the kernel solver makes it);
himalaya's ``MultipleKernelRidgeCV`` then weighs them, ``K = sum_b exp(delta_b) K_b``, choosing
the weights and the penalty per target by a seeded random search over the same inner splits as
the other solvers. A band that does not help is weighed down rather than left to fit noise,
which concatenating the keys would not do. The outer folds and the held-out Pearson r are the
other solvers'; the weights, normalised to sum to 1 per target, say how much each band counts.
"""

from __future__ import annotations

import numpy as np
import torch

from probe.analyses.encode.ridge import inner_splits, pearson_columns
from probe.errors import ConfigError

__all__ = ["solve_banded", "banded_bytes", "ITERATIONS"]

ITERATIONS = 50  # weight combinations tried per fold (himalaya's default is 100)


def solve_banded(grams: torch.Tensor, y: np.ndarray, fold_of: np.ndarray, alphas: list[float],
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The outer folds' held-out Pearson r, chosen alphas and band weights.

    Args:
        grams: (bands, N, N) float64, each band's Gram matrix of the rows.
        y: (N, V) targets.

    Returns:
        ``(r, alpha, weights)``: (folds, V), (folds, V), (folds, bands, V).

    Raises:
        ConfigError: himalaya is not installed.
    """
    try:
        from himalaya.backend import get_backend, set_backend
        from himalaya.kernel_ridge import MultipleKernelRidgeCV
    except ImportError:
        raise ConfigError("bands= needs himalaya: pip install 'probe[analysis]'") from None
    k = int(fold_of.max()) + 1
    members = [np.flatnonzero(fold_of == g) for g in range(k)]
    bands, columns = grams.shape[0], y.shape[1]
    r, chosen = np.zeros((k, columns)), np.zeros((k, columns))
    weights = np.zeros((k, bands, columns))
    previous = get_backend()
    backend = set_backend("torch_cuda" if grams.device.type == "cuda" else "torch")
    try:
        for f in range(k):
            train, inner = inner_splits(members, f)
            test = members[f]
            model = MultipleKernelRidgeCV(
                kernels="precomputed", solver="random_search", fit_intercept=True, cv=inner,
                random_state=seed, solver_params={
                    "n_iter": ITERATIONS, "alphas": np.asarray(alphas, dtype=np.float64),
                    "progress_bar": False})
            rows = torch.as_tensor(train, device=grams.device)
            model.fit(grams[:, rows][:, :, rows], y[train])
            held = torch.as_tensor(test, device=grams.device)
            prediction = np.asarray(backend.to_numpy(model.predict(grams[:, held][:, :, rows])))
            r[f] = pearson_columns(prediction.reshape(len(test), -1), y[test])
            deltas = np.asarray(backend.to_numpy(model.deltas_))
            weights[f] = np.exp(deltas) / np.exp(deltas).sum(0, keepdims=True)
            chosen[f] = np.asarray(backend.to_numpy(model.best_alphas_))
    finally:
        set_backend(previous)
    return r, chosen, weights


def banded_bytes(bands: int, rows: int, columns: int) -> int:
    """About the most memory ``solve_banded`` holds (float64): every band's Gram matrix, the
    training rows' copy of them, and himalaya's weighted kernel and its eigenvectors."""
    return 8 * (2 * bands * rows * rows + 3 * rows * rows + 2 * rows * columns)
