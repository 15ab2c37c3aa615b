"""Representational similarity analysis, with rsatoolbox's conventions.

An RDM (representational dissimilarity matrix) holds ``1 - Pearson r`` between the rows of two
samples (rsatoolbox's ``method='correlation'``: each row centred and scaled over its own
features). Two RDMs are compared by the Spearman correlation of their upper triangles (above
the diagonal), rsatoolbox's ``compare(..., method='spearman')``: the Pearson correlation of
their ranks, ties given their mean rank.

An RDM is N x N, so it is made over at most ``rdm_samples`` samples (a seeded subset); its
rows are read in blocks (probe.analyses.compare.cka.each_block_pair), and each block pair's
dissimilarities go straight into the upper triangle (``rdm_upper``, what the comparison needs:
half an N x N matrix) or into the whole matrix (``rdm``, to save or to bootstrap).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from probe.analyses.compare.cka import Rows, each_block_pair, matmul, panel_rows
from probe.analyses.stats import AlignedRows

__all__ = ["rdm", "rdm_upper", "ranked", "upper_ranks", "spearman_matrix", "subset"]


def subset(num_rows: int, rdm_samples: int | None, seed: int) -> np.ndarray:
    """The positions an RDM is made of: all, or ``rdm_samples`` of them drawn with ``seed``,
    in increasing order (so that they are read in file order)."""
    if rdm_samples is None or num_rows <= int(rdm_samples):
        return np.arange(num_rows)
    chosen = np.random.default_rng(seed).choice(num_rows, int(rdm_samples), replace=False)
    return np.sort(chosen)


def _dissimilarities(reader: AlignedRows, name: str, room: int,
                     visit: Callable[[tuple[int, int], tuple[int, int], torch.Tensor], None]
                     ) -> None:
    # visit(panel, block, 1 - r) for every block pair at or after the diagonal
    rows = panel_rows(reader, [name], room)

    def block_pair(panel: tuple[int, int], block: tuple[int, int], zp: Rows, zb: Rows) -> None:
        visit(panel, block, matmul(zp[name], zb[name].T).neg_().add_(1.0))

    each_block_pair(reader, [name], rows, block_pair, {}, standardise=True)


def rdm(reader: AlignedRows, name: str, budget: int) -> torch.Tensor:
    """The (N, N) RDM of one source over all of ``reader``'s positions, float64."""
    n = reader.num_rows
    result = torch.empty(n, n, dtype=torch.float64, device=reader.device)

    def visit(panel: tuple[int, int], block: tuple[int, int], d: torch.Tensor) -> None:
        (p0, p1), (b0, b1) = panel, block
        result[p0:p1, b0:b1] = d
        result[b0:b1, p0:p1] = d.T

    _dissimilarities(reader, name, budget - 8 * n * n, visit)
    result.fill_diagonal_(0.0)
    return result


def rdm_upper(reader: AlignedRows, name: str, budget: int,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """The upper triangle of one source's RDM (above the diagonal, row by row as
    ``np.triu_indices(n, 1)`` and scipy's ``pdist``), float64, made without the N x N matrix
    (into ``out`` if given)."""
    n = reader.num_rows
    result = out if out is not None else torch.empty(n * (n - 1) // 2, dtype=torch.float64,
                                                     device=reader.device)

    def visit(panel: tuple[int, int], block: tuple[int, int], d: torch.Tensor) -> None:
        (p0, p1), (b0, b1) = panel, block
        for i in range(p0, min(p1, b1 - 1)):  # row i's part of the block right of the diagonal
            lo = max(b0, i + 1)
            start = i * n - i * (i + 1) // 2 + lo - i - 1
            result[start:start + b1 - lo] = d[i - p0, lo - b0:]

    _dissimilarities(reader, name, budget - 8 * len(result), visit)
    return result


def ranked(values: torch.Tensor) -> torch.Tensor:
    """``values`` replaced by their ranks, ties given their mean rank, less their mean: the
    Pearson correlation of two of them is their Spearman correlation (``spearman_matrix``).

    In place, so that the ranks a caller keeps are the block of memory made first, not one
    made after the temporaries of the sort (a heap of cached ranks and freed temporaries
    between them grows past what is alive). Mean ranks always add up to M(M+1)/2, so the mean
    (M+1)/2 is subtracted exactly.
    """
    return _ranks_in_place(values).sub_((len(values) + 1) / 2)


def upper_ranks(matrix: torch.Tensor) -> torch.Tensor:
    """``ranked`` of the upper triangle (above the diagonal, row by row as
    ``np.triu_indices(n, 1)``) of a square matrix."""
    n = matrix.shape[0]
    above = torch.ones(n, n, dtype=torch.bool, device=matrix.device).triu_(1)
    return ranked(matrix[above])  # row by row, as np.triu_indices(n, 1)


def _mean_ranks(values: torch.Tensor) -> torch.Tensor:
    # as scipy.stats.rankdata(method="average"), ranks from 1, in a new tensor
    return _ranks_in_place(values.to(torch.float64, copy=True))


def _ranks_in_place(values: torch.Tensor) -> torch.Tensor:
    # float64 values replaced by their ranks from 1, ties given their mean rank
    ordered, order = torch.sort(values)
    if not (ordered[1:] == ordered[:-1]).any():  # no ties, as almost always: 1 .. M
        values[order] = torch.arange(1, len(values) + 1, out=ordered)
        return values
    _, counts = torch.unique_consecutive(ordered, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    mean_rank = ends - (counts.to(torch.float64) - 1) / 2  # the mean of start+1 .. end
    values[order] = torch.repeat_interleave(mean_rank, counts)
    return values


def spearman_matrix(left: Sequence[str], right: Sequence[str],
                    ranks_of: Callable[[str], torch.Tensor]) -> dict[tuple[str, str], float]:
    """The Spearman correlation of every pair's RDMs, from ``ranks_of(name)`` (``ranked``
    upper triangles of that source's RDM, computed or cached by the caller); NaN for a
    constant RDM (whose ranks are all 0).

    The sums of products are torch's sums, which add in a cascade (error about 1e-16), not dot
    products: BLAS adds millions of products in a few running sums, about 1e-12 off here.
    """
    squares: dict[str, float] = {}

    def ranks(name: str) -> torch.Tensor:
        found = ranks_of(name)
        if name not in squares:
            squares[name] = float((found * found).sum())
        return found

    values = {}
    for a in left:
        ra = ranks(a)
        for b in right:
            rb = ra if b == a else ranks(b)
            if not (squares[a] > 0 and squares[b] > 0):
                values[(a, b)] = float("nan")
            else:
                r = float((ra * rb).sum()) / math.sqrt(squares[a] * squares[b])
                values[(a, b)] = min(1.0, max(-1.0, r))
    return values
