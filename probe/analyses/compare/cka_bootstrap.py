"""Bootstrap intervals of CKA over the samples: each draw takes the N samples with replacement
(the draws of RSA's bootstrap, probe.analyses.compare.brain.draws) and CKA is computed on the
drawn samples; the interval is the 2.5th and 97.5th percentile of the draws' values.

A draw is a vector of counts c (how often each sample was drawn), and every sum that CKA needs
(probe.analyses.compare.cka.KernelSums) is a product of the N x N Gram matrices with it: a drawn
copy of sample i has row sum ``(Kc)_i``, ``<K_s, L_s> = cᵀ (K∘L) c``, and so on. So each Gram is
made once, a batch of draws is a few matrix products, and no resampled matrix is ever made.

Both estimators take the drawn rows as they are, copies included, as the textbook bootstrap
does. (Leaving out the pairs of a sample's copies, as RSA's bootstrap does with its RDMs, would
make the debiased estimator change under a shift of the features: it is a U-statistic only
over a full set of pairs.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from probe.analyses.compare.brain import draws, percentile_interval
from probe.analyses.compare.cka import (
    KernelSums,
    cka_from_sums,
    each_block_pair,
    matmul,
    panel_rows,
)
from probe.analyses.stats import AlignedRows, memory_mb_for, working_budget
from probe.errors import ConfigError

__all__ = ["cka_intervals"]

Pair = tuple[str, str]


def cka_intervals(reader: AlignedRows, left: Sequence[str], right: Sequence[str], *,
                  debiased: bool, budget: int, samples: int, seed: int
                  ) -> dict[Pair, tuple[float, float]]:
    """The 95% interval of CKA for every ``(l, r)`` over ``samples`` seeded draws of the rows.

    Raises:
        ConfigError: the Gram matrices of every key do not fit in ``budget``.
    """
    budget = working_budget(budget)
    n = reader.num_rows
    names = list(dict.fromkeys([*left, *right]))
    grams_bytes = 8 * n * n * len(names)
    if grams_bytes > budget // 2:
        raise ConfigError(f"bootstrap of CKA holds the {len(names)} Gram matrices of {n} rows "
                          f"at once, which needs memory_mb={memory_mb_for(2 * grams_bytes):.3g} "
                          "or more; raise memory_mb or compare fewer keys")
    room = budget - grams_bytes  # beside the Grams: the blocks of rows, then the draws' work
    grams = _grams(reader, names, room)
    pairs = sorted({tuple(sorted((a, b))) for a in left for b in right}
                   | {(name, name) for name in names})
    # a batch of draws: its counts and every key's K c, (n, batch) each
    batch = max(1, min(samples, room // 2 // (8 * n * (len(names) + 1))))
    rows = max(1, min(n, room // 2 // (8 * (n + batch))))  # a block of K∘L and its product
    found: dict[Pair, list[float]] = {(a, b): [] for a in left for b in right}
    drawn = draws(n, samples, seed)
    for start in range(0, samples, batch):
        chosen = [next(drawn) for _ in range(min(batch, samples - start))]
        counts = torch.stack([torch.bincount(torch.from_numpy(c), minlength=n) for c in chosen],
                             1).to(torch.float64).to(reader.device)
        sums = _draw_sums(grams, pairs, counts, rows)
        for a, b in found:  # HSIC of (K, L) is that of (L, K): one order's sums serve both
            between = sums[tuple(sorted((a, b)))]
            found[(a, b)].extend(cka_from_sums(between[k], sums[(a, a)][k], sums[(b, b)][k],
                                               debiased) for k in range(len(chosen)))
    return {pair: percentile_interval(values) for pair, values in found.items()}


def _grams(reader: AlignedRows, names: list[str], room: int) -> dict[str, torch.Tensor]:
    # every key's N x N Gram matrix of its shifted rows (CKA does not change under the shift)
    n = reader.num_rows
    grams = {name: torch.empty(n, n, dtype=torch.float64, device=reader.device)
             for name in names}

    def visit(panel: tuple[int, int], block: tuple[int, int], zp, zb) -> None:
        (p0, p1), (b0, b1) = panel, block
        for name in names:
            k = matmul(zp[name], zb[name].T)
            grams[name][p0:p1, b0:b1] = k
            grams[name][b0:b1, p0:p1] = k.T

    each_block_pair(reader, names, panel_rows(reader, names, room), visit, {})
    return grams


def _draw_sums(grams: dict[str, torch.Tensor], pairs: list[Pair], counts: torch.Tensor,
               rows: int) -> dict[Pair, list[KernelSums]]:
    """Each pair's sums over the drawn samples, one ``KernelSums`` a draw (a column of
    ``counts``): a sum over the drawn rows is one over the samples weighted by their counts."""
    n = len(counts)
    diagonal = {name: k.diagonal()[:, None] for name, k in grams.items()}
    row_sums = {name: k @ counts for name, k in grams.items()}  # a drawn row's, (n, draws)
    sums = {}
    for a, b in pairs:
        kl = torch.zeros(counts.shape[1], dtype=torch.float64, device=counts.device)
        for r0 in range(0, n, rows):  # cᵀ (K∘L) c, a block of rows at a time
            block = grams[a][r0:r0 + rows] * grams[b][r0:r0 + rows]
            kl += ((block @ counts) * counts[r0:r0 + rows]).sum(0)
        da, db, ra, rb = diagonal[a], diagonal[b], row_sums[a], row_sums[b]
        columns = {"kl": kl, "rt": (counts * ra * rb).sum(0), "dd": (counts * da * db).sum(0),
                   "rd": (counts * ra * db).sum(0), "dr": (counts * da * rb).sum(0),
                   "sk": (counts * ra).sum(0), "sl": (counts * rb).sum(0),
                   "tk": (counts * da).sum(0), "tl": (counts * db).sum(0)}
        values = {key: column.tolist() for key, column in columns.items()}
        sums[(a, b)] = [KernelSums(n=n, **{key: v[k] for key, v in values.items()})
                        for k in range(counts.shape[1])]
    return sums
