"""Representational similarity analysis, with rsatoolbox's conventions.

An RDM (representational dissimilarity matrix) holds ``1 - Pearson r`` between the rows of two
samples (rsatoolbox's ``method='correlation'``: each row centred and scaled over its own
features). Two RDMs are compared by the Spearman correlation of their upper triangles (above
the diagonal), rsatoolbox's ``compare(..., method='spearman')``: the Pearson correlation of
their ranks, ties given their mean rank.

An RDM is N x N, so it is made over at most ``rdm_samples`` samples (a seeded subset); its
rows are read in blocks and only the N x N matrix itself is held, one key at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from probe.analyses.compare.cka import gram_blocks
from probe.analyses.stats import AlignedRows

__all__ = ["rdm", "upper_ranks", "spearman_matrix", "subset"]


def subset(num_rows: int, rdm_samples: int | None, seed: int) -> np.ndarray:
    """The positions an RDM is made of: all, or ``rdm_samples`` of them drawn with ``seed``,
    in increasing order (so that they are read in file order)."""
    if rdm_samples is None or num_rows <= int(rdm_samples):
        return np.arange(num_rows)
    chosen = np.random.default_rng(seed).choice(num_rows, int(rdm_samples), replace=False)
    return np.sort(chosen)


def rdm(reader: AlignedRows, name: str, budget: int) -> torch.Tensor:
    """The (N, N) RDM of one source over all of ``reader``'s positions, float64."""
    n = reader.num_rows
    width = reader.width(name)
    # two blocks of rows (16 bytes a value) beside the N x N result
    room = max(budget - 8 * n * n, budget // 4)
    rows = max(1, min(n, room // (32 * width)))
    similarity = torch.empty(n, n, dtype=torch.float64, device=reader.device)
    for (p0, p1), (b0, b1), zp, zb in gram_blocks(reader, [name], rows, {}, standardise=True):
        block = zp[name] @ zb[name].T
        similarity[p0:p1, b0:b1] = block
        similarity[b0:b1, p0:p1] = block.T
    result = 1.0 - similarity
    result.fill_diagonal_(0.0)
    return result


def upper_ranks(matrix: torch.Tensor) -> torch.Tensor:
    """The ranks of the upper triangle (above the diagonal, row by row as
    ``np.triu_indices(n, 1)``) of a square matrix, ties given their mean rank, then centred
    and scaled to norm 1: the dot product of two of them is their Spearman correlation."""
    n = matrix.shape[0]
    above = torch.ones(n, n, dtype=torch.bool, device=matrix.device).triu_(1)
    values = matrix[above]  # row by row, as np.triu_indices(n, 1)
    del above
    ranks = _mean_ranks(values)
    ranks -= ranks.mean()
    norm = ranks.norm()
    return ranks / norm if norm > 0 else ranks


def _mean_ranks(values: torch.Tensor) -> torch.Tensor:
    # as scipy.stats.rankdata(method="average"), ranks from 1
    order = torch.argsort(values, stable=True)
    ordered = values[order]
    _, counts = torch.unique_consecutive(ordered, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    mean_rank = ends - (counts.to(torch.float64) - 1) / 2  # the mean of start+1 .. end
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = torch.repeat_interleave(mean_rank, counts)
    return ranks


def spearman_matrix(left: Sequence[str], right: Sequence[str],
                    ranks_of: Callable[[str], torch.Tensor]) -> dict[tuple[str, str], float]:
    """The Spearman correlation of every pair's RDMs, from ``ranks_of(name)`` (``upper_ranks``
    of that source's RDM, computed or cached by the caller); NaN for a constant RDM."""
    values = {}
    for a in left:
        ra = ranks_of(a)
        for b in right:
            rb = ra if b == a else ranks_of(b)
            if ra.norm() == 0 or rb.norm() == 0:
                values[(a, b)] = float("nan")
            else:
                values[(a, b)] = float((ra @ rb).clamp(-1.0, 1.0))
    return values
