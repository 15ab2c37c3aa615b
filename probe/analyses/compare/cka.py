"""Linear CKA from sums streamed over the samples, never from the whole feature matrix.

Linear CKA (Kornblith et al. 2019) of X (N, Dx) and Y (N, Dy) is
``HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`` with the linear kernels ``K = X Xᵀ``,
``L = Y Yᵀ``. Both estimators of HSIC are functions of a few sums over the samples
(``KernelSums``):

- biased (``cka``): ``tr(K H L H)``, H the centring matrix; for centred features it is
  ``||Xcᵀ Yc||_F²``, and CKA is invariant to orthogonal transforms and isotropic scaling;
- debiased (``cka_debiased``): the unbiased estimator of Song et al. (2012, eq. 5), used by
  Nguyen et al. (2021): with K~, L~ the kernels with their diagonals set to 0,
  ``[tr(K~L~) + 1ᵀK~1 1ᵀL~1 / ((n-1)(n-2)) - 2/(n-2) 1ᵀK~L~1] / (n(n-3))``.

The sums come from one of two accumulations, picked per key by its width D against the number
of samples N (``plan``):

- **features** (D <= N): per key the sum of its rows and ZᵀZ (D x D), per pair the cross
  products ZᵀW (Dx x Dy), all added block by block in one pass over the file;
- **gram** (D > N, where D x D would outgrow N x N): the N x N Gram matrices, made block pair
  by block pair (a panel of rows against every later block) and reduced at once to the sums:
  no N x N matrix is ever held, at the price of reading the file N / panel times.

Rows are shifted by the mean of their first block before anything is summed: the estimators do
not change under a shift of the features, and the sums then stay small next to the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from probe.analyses.stats import MIB, AlignedRows, blocks_of
from probe.errors import ConfigError

__all__ = ["KernelSums", "hsic", "cka_from_sums", "cka_matrix", "plan", "ACCUMULATIONS"]

ACCUMULATIONS = ("auto", "features", "gram")
Pair = tuple[str, str]


@dataclass(frozen=True)
class KernelSums:
    """The sums over the samples of two kernels K and L that both HSIC estimators need."""

    n: int
    kl: float  # <K, L>_F
    rt: float  # sum_i (K1)_i (L1)_i
    dd: float  # sum_i K_ii L_ii
    rd: float  # sum_i (K1)_i L_ii
    dr: float  # sum_i K_ii (L1)_i
    sk: float  # 1ᵀK1
    sl: float  # 1ᵀL1
    tk: float  # tr K
    tl: float  # tr L


def hsic(s: KernelSums, debiased: bool = False) -> float:
    """HSIC of two kernels from their sums, up to a factor that CKA cancels.

    Biased: ``tr(K H L H) = <K, L> - 2/n 1ᵀKL1 + 1ᵀK1 1ᵀL1 / n²``. Debiased: the estimator of
    Song et al. (2012), which needs n >= 4.
    """
    n = s.n
    if not debiased:
        return s.kl - 2.0 * s.rt / n + s.sk * s.sl / (n * n)
    traces = s.kl - s.dd                          # tr(K~ L~)
    ones = (s.sk - s.tk) * (s.sl - s.tl)          # 1ᵀK~1 1ᵀL~1
    cross = s.rt - s.rd - s.dr + s.dd             # 1ᵀK~L~1
    return (traces + ones / ((n - 1) * (n - 2)) - 2.0 * cross / (n - 2)) / (n * (n - 3))


def cka_from_sums(between: KernelSums, left: KernelSums, right: KernelSums,
                  debiased: bool = False) -> float:
    """CKA from the sums of (K, L), (K, K) and (L, L); NaN where a self-HSIC is not positive
    (features constant over the samples, or a debiased estimate of few samples)."""
    denominator = hsic(left, debiased) * hsic(right, debiased)
    if not denominator > 0:
        return math.nan
    return hsic(between, debiased) / math.sqrt(denominator)


def plan(widths: dict[str, int], num_rows: int, budget: int, accumulate: str) -> set[str]:
    """The sources to compare through N x N Gram blocks (the others through D x D sums).

    Raises:
        ConfigError: an unknown ``accumulate``, or ``features`` for a key whose D x D matrix
            does not fit in the budget.
    """
    if accumulate not in ACCUMULATIONS:
        raise ConfigError(f"accumulate={accumulate!r}: use auto, features or gram")
    if accumulate == "gram":
        return set(widths)
    too_wide = {name for name, d in widths.items() if 8 * d * d > budget // 4}
    if accumulate == "features":
        if too_wide:
            name = sorted(too_wide)[0]
            need = 4 * 8 * widths[name] ** 2 / MIB
            raise ConfigError(f"accumulate=features needs a {widths[name]} x {widths[name]} "
                              f"matrix for {_key(name)}, more than memory_mb allows (about "
                              f"{need:.0f} MiB); use accumulate=auto or gram, or a larger "
                              "memory_mb")
        return set()
    return too_wide | {name for name, d in widths.items() if d > num_rows}


def _key(name: str) -> str:
    # a source's name is "<side>:<key>" (probe.analyses.compare); users know the key
    return name.partition(":")[2] or name


def cka_matrix(reader: AlignedRows, left: Sequence[str], right: Sequence[str], *,
               debiased: bool, budget: int, accumulate: str = "auto") -> dict[Pair, float]:
    """CKA of every source in ``left`` with every source in ``right``.

    Args:
        reader: the aligned rows of every source.
        left, right: source names; the same list for every pair within one file.
        debiased: the unbiased HSIC estimator instead of the biased one.
        budget: bytes for the blocks of rows and the sums together.
        accumulate: ``auto`` (by width, see ``plan``), ``features`` or ``gram``.

    Returns:
        ``{(l, r): value}`` for every ``l`` in ``left`` and ``r`` in ``right``.

    Raises:
        ConfigError: too few samples for the estimator, or see ``plan``.
    """
    need = 4 if debiased else 2
    if reader.num_rows < need:
        raise ConfigError(f"{'cka_debiased' if debiased else 'cka'} needs at least {need} "
                          f"samples shared by both sides, and there are {reader.num_rows}")
    names = list(dict.fromkeys([*left, *right]))
    gram = plan({name: reader.width(name) for name in names}, reader.num_rows, budget,
                accumulate)
    symmetric = list(left) == list(right)
    pairs = {(a, b) for a in left for b in right if not (symmetric and a > b)}
    pairs |= {(name, name) for name in names}
    via_gram = {p for p in pairs if p[0] in gram or p[1] in gram}
    sums = {**_feature_sums(reader, pairs - via_gram, budget),
            **_gram_sums(reader, via_gram, budget)}
    values = {}
    for a in left:
        for b in right:
            between = sums.get((a, b)) or _transposed(sums[(b, a)])
            values[(a, b)] = cka_from_sums(between, sums[(a, a)], sums[(b, b)], debiased)
    return values


def _transposed(s: KernelSums) -> KernelSums:
    return KernelSums(s.n, s.kl, s.rt, s.dd, s.dr, s.rd, s.sl, s.sk, s.tl, s.tk)


# --- features: D x D sums -------------------------------------------------------------------

def _feature_sums(reader: AlignedRows, pairs: set[Pair], budget: int) -> dict[Pair, KernelSums]:
    if not pairs:
        return {}
    sums: dict[Pair, KernelSums] = {}
    for group in _feature_passes(reader, sorted(pairs), budget // 2):
        names = list(dict.fromkeys(name for pair in group for name in pair))
        state = _FeaturePass(names, group, reader)
        for start, stop in reader.blocks(names, budget // 2):
            state.add(reader.read(start, stop, names))
        sums.update(state.sums())
    return sums


def _feature_passes(reader: AlignedRows, pairs: list[Pair], budget: int) -> list[list[Pair]]:
    # pairs grouped so that each pass's cross products fit in the budget; most runs need one
    passes: list[list[Pair]] = []
    size = 0
    for a, b in pairs:
        need = 8 * reader.width(a) * reader.width(b)
        if passes and size + need <= budget:
            passes[-1].append((a, b))
            size += need
        else:
            passes.append([(a, b)])
            size = need
    return passes


class _FeaturePass:
    """One pass over the blocks: for each source the sum of its shifted rows z, the sum of
    their squared norms q and ``Σ z q_mᵀ`` against every source m's norms; for each pair the
    cross products ``Σ z wᵀ``."""

    def __init__(self, names: list[str], pairs: list[Pair], reader: AlignedRows):
        self.names, self.pairs, self.n = names, pairs, 0
        device = reader.device
        zeros = {name: torch.zeros(reader.width(name), dtype=torch.float64, device=device)
                 for name in names}
        self.shift: dict[str, torch.Tensor] = {}
        self.total = zeros
        self.norms = torch.zeros(len(names), dtype=torch.float64, device=device)
        self.norm_products = torch.zeros(len(names), len(names), dtype=torch.float64,
                                         device=device)
        self.weighted = {name: torch.zeros(reader.width(name), len(names), dtype=torch.float64,
                                           device=device) for name in names}
        self.cross = {(a, b): torch.zeros(reader.width(a), reader.width(b), dtype=torch.float64,
                                          device=device) for a, b in pairs}

    def add(self, block: dict[str, torch.Tensor]) -> None:
        if not self.shift:
            self.shift = {name: block[name].mean(0) for name in self.names}
        z = {name: block[name] - self.shift[name] for name in self.names}
        q = torch.stack([(z[name] * z[name]).sum(1) for name in self.names], 1)
        self.n += len(q)
        self.norms += q.sum(0)
        self.norm_products += q.T @ q
        for name in self.names:
            self.total[name] += z[name].sum(0)
            self.weighted[name] += z[name].T @ q
        for a, b in self.pairs:
            self.cross[(a, b)] += z[a].T @ z[b]

    def sums(self) -> dict[Pair, KernelSums]:
        at = {name: i for i, name in enumerate(self.names)}
        found = {}
        for a, b in self.pairs:
            c, sa, sb, i, j = self.cross[(a, b)], self.total[a], self.total[b], at[a], at[b]
            found[(a, b)] = KernelSums(
                n=self.n, kl=float((c * c).sum()), rt=float(sa @ c @ sb),
                dd=float(self.norm_products[i, j]),
                rd=float(sa @ self.weighted[a][:, j]), dr=float(sb @ self.weighted[b][:, i]),
                sk=float(sa @ sa), sl=float(sb @ sb),
                tk=float(self.norms[i]), tl=float(self.norms[j]))
        return found


# --- gram: N x N blocks, reduced as they are made -------------------------------------------

def _gram_sums(reader: AlignedRows, pairs: set[Pair], budget: int) -> dict[Pair, KernelSums]:
    if not pairs:
        return {}
    names = sorted({name for pair in pairs for name in pair})
    rows = _panel_rows(reader, names, budget)
    n, device = reader.num_rows, reader.device
    row_sums = {name: torch.zeros(n, dtype=torch.float64, device=device) for name in names}
    diagonal = {name: torch.zeros(n, dtype=torch.float64, device=device) for name in names}
    inner = dict.fromkeys(pairs, 0.0)
    shift: dict[str, torch.Tensor] = {}
    for (p0, p1), (b0, b1), zp, zb in gram_blocks(reader, names, rows, shift):
        kernels = {name: zp[name] @ zb[name].T for name in names}
        same = p0 == b0
        for name, k in kernels.items():
            row_sums[name][p0:p1] += k.sum(1)
            if same:
                diagonal[name][p0:p1] = k.diagonal()
            else:  # the block below the diagonal is this one transposed
                row_sums[name][b0:b1] += k.sum(0)
        for a, b in pairs:
            inner[(a, b)] += (1.0 if same else 2.0) * float((kernels[a] * kernels[b]).sum())
    found = {}
    for a, b in pairs:
        ra, rb, da, db = row_sums[a], row_sums[b], diagonal[a], diagonal[b]
        found[(a, b)] = KernelSums(n=n, kl=inner[(a, b)], rt=float(ra @ rb),
                                   dd=float(da @ db), rd=float(ra @ db), dr=float(da @ rb),
                                   sk=float(ra.sum()), sl=float(rb.sum()),
                                   tk=float(da.sum()), tl=float(db.sum()))
    return found


def _panel_rows(reader: AlignedRows, names: Sequence[str], budget: int) -> int:
    # two blocks of rows (16 bytes a value, see probe.analyses.stats) and one b x b kernel per
    # source
    width = sum(reader.width(name) for name in names)
    a, b = 8.0 * len(names), 32.0 * width
    rows = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
    return max(1, min(reader.num_rows, rows))


def gram_blocks(reader: AlignedRows, names: Sequence[str], rows: int,
                shift: dict[str, torch.Tensor], standardise: bool = False):
    """Every pair of row blocks (panel, block) at or after the diagonal, with their shifted
    (or, with ``standardise``, per-row standardised) rows: ``((p0, p1), (b0, b1), zp, zb)``.

    The panel stays in memory while the later blocks stream past it; ``shift`` is filled with
    the mean of the first panel's rows when empty.
    """
    blocks = list(blocks_of(reader.num_rows, rows))
    for i, (p0, p1) in enumerate(blocks):
        zp = _prepared(reader.read(p0, p1, names), shift, standardise)
        for b0, b1 in blocks[i:]:
            zb = zp if b0 == p0 else _prepared(reader.read(b0, b1, names), shift, standardise)
            yield (p0, p1), (b0, b1), zp, zb


def _prepared(block: dict[str, torch.Tensor], shift: dict[str, torch.Tensor],
              standardise: bool) -> dict[str, torch.Tensor]:
    if standardise:  # each row to mean 0 and norm 1 over its own features
        centred = {name: x - x.mean(1, keepdim=True) for name, x in block.items()}
        return {name: x / x.norm(dim=1, keepdim=True).clamp_min(1e-300)
                for name, x in centred.items()}
    if not shift:
        shift.update({name: x.mean(0) for name, x in block.items()})
    return {name: x - shift[name] for name, x in block.items()}
