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

The sums of a pair come from one of two accumulations (``plan`` picks, by cost):

- **features**: the cross products ZᵀW (Dx x Dy) of the pair, and per key ZᵀZ and the sum of
  its rows, added block by block in one pass over the rows for every such pair: N Dx Dy
  multiply-adds a pair;
- **gram**: the N x N Gram matrix of each key, made block pair by block pair (a panel of rows
  against every later block) and reduced at once to the sums of every pair of such keys: N² D / 2
  multiply-adds a key, shared by all its pairs, and the rows read about k/2 times for k panels;
  no N x N matrix is ever held.

A pair goes through the Grams when both its keys do. Wide keys compared with wide keys gain
(``N² (Dx + Dy) / 2`` is less than ``N Dx Dy`` once the partners are wider than N/2 together),
narrow keys of many samples do not. The products are float64 of the float32 rows (with float32
products CKA was 2e-10 off on 5000 samples of 4096 features), on the CPU by numpy's BLAS,
which multiplies a matrix by its own transpose in half the time (syrk).

Rows are shifted by the mean of their first block before anything is summed: the estimators do
not change under a shift of the features, and the sums then stay small next to the data. A
block is shifted as it is read (``BlockReader``) and serves every pair it is part of.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from probe.analyses.stats import MIB, AlignedRows, blocks_of, read_rows, working_budget
from probe.errors import ConfigError

__all__ = ["KernelSums", "hsic", "cka_from_sums", "cka_matrix", "plan", "each_block_pair",
           "panel_rows", "BlockReader", "matmul", "ACCUMULATIONS"]

ACCUMULATIONS = ("auto", "features", "gram")
Pair = tuple[str, str]
Rows = dict[str, torch.Tensor]
BlockPair = Callable[[tuple[int, int], tuple[int, int], Rows, Rows], None]


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


# --- which pairs go through Grams -------------------------------------------------------------

def plan(widths: dict[str, int], pairs: Iterable[Pair], num_rows: int, budget: int,
         accumulate: str) -> set[str]:
    """The sources to compare through N x N Gram blocks (the others through D x D sums).

    ``auto`` takes the cheapest choice in multiply-adds (``_cheapest``), then moves the widest
    of the other sources to the Grams while their D x D sums outgrow half the budget.

    Raises:
        ConfigError: an unknown ``accumulate``, or ``features`` for a key whose D x D matrix
            does not fit in the budget.
    """
    if accumulate not in ACCUMULATIONS:
        raise ConfigError(f"accumulate={accumulate!r}: use auto, features or gram")
    if accumulate == "gram":
        return set(widths)
    if accumulate == "features":
        too_wide = sorted(name for name, d in widths.items() if 8 * d * d > budget // 4)
        if too_wide:
            name = too_wide[0]
            need = 4 * 8 * widths[name] ** 2 / MIB
            raise ConfigError(f"accumulate=features needs a {widths[name]} x {widths[name]} "
                              f"matrix for {_key(name)}, more than memory_mb allows (about "
                              f"{need:.0f} MiB); use accumulate=auto or gram, or a larger "
                              "memory_mb")
        return set()
    pairs = list(pairs)
    gram = _cheapest(widths, pairs, num_rows)
    while _feature_bytes(widths, [p for p in pairs if not set(p) <= gram]) > budget // 2:
        gram.add(max(set(widths) - gram, key=lambda name: (widths[name], name)))
    return gram


def _cheapest(widths: dict[str, int], pairs: list[Pair], n: int) -> set[str]:
    # A source's Gram costs n² D / 2 once; a pair costs n² through the Grams of both its
    # sources, else n Da Db (n D² / 2 with itself, by syrk). Moving one source at a time while
    # that lowers the total, from none and from all, reaches the optimum for the usual
    # bipartite pairs; the cheaper of the two ends is kept.
    partners: dict[str, list[str]] = {name: [] for name in widths}
    for a, b in pairs:
        partners[a].append(b)
        if b != a:
            partners[b].append(a)

    def saving(name: str, gram: set[str]) -> float:  # of adding name to gram
        d = widths[name]
        saved = -n * n * d / 2
        for other in partners[name]:
            if other == name:
                saved += n * d * d / 2 - n * n
            elif other in gram:
                saved += n * d * widths[other] - n * n
        return saved

    def climbed(gram: set[str]) -> tuple[float, set[str]]:
        cost = _cost(widths, pairs, n, gram)
        while True:
            moves = [(saving(k, gram) if k not in gram else -saving(k, gram - {k}), k)
                     for k in sorted(widths)]
            gain, name = max(moves)
            if gain <= 0:
                return cost, gram
            gram = gram ^ {name}
            cost -= gain

    return min(climbed(set()), climbed(set(widths)), key=lambda found: found[0])[1]


def _cost(widths: dict[str, int], pairs: list[Pair], n: int, gram: set[str]) -> float:
    cost = sum(n * n * widths[name] / 2 for name in gram)
    for a, b in pairs:
        if a in gram and b in gram:
            cost += n * n
        else:
            cost += n * widths[a] * widths[b] / (2 if a == b else 1)
    return cost


def _feature_bytes(widths: dict[str, int], pairs: list[Pair]) -> int:
    # the float64 sums that stay for the whole pass: Da x Db a pair, and the largest once more
    # for a block's product before it is added
    products = [widths[a] * widths[b] for a, b in pairs]
    return 8 * (sum(products) + max(products, default=0))


def _key(name: str) -> str:
    # a source's name is "<side>:<key>" (probe.analyses.compare); users know the key
    return name.partition(":")[2] or name


# --- the values -------------------------------------------------------------------------------

def cka_matrix(reader: AlignedRows, left: Sequence[str], right: Sequence[str], *,
               debiased: bool, budget: int, accumulate: str = "auto") -> dict[Pair, float]:
    """CKA of every source in ``left`` with every source in ``right``.

    Args:
        reader: the aligned rows of every source.
        left, right: source names; the same list for every pair within one file.
        debiased: the unbiased HSIC estimator instead of the biased one.
        budget: bytes for the blocks of rows and the sums together.
        accumulate: ``auto`` (by cost, see ``plan``), ``features`` or ``gram``.

    Returns:
        ``{(l, r): value}`` for every ``l`` in ``left`` and ``r`` in ``right``.

    Raises:
        ConfigError: too few samples for the estimator, or see ``plan``.
    """
    budget = working_budget(budget)
    need = 4 if debiased else 2
    if reader.num_rows < need:
        raise ConfigError(f"{'cka_debiased' if debiased else 'cka'} needs at least {need} "
                          f"samples shared by both sides, and there are {reader.num_rows}")
    names = list(dict.fromkeys([*left, *right]))
    symmetric = list(left) == list(right)
    pairs = {(a, b) for a in left for b in right if not (symmetric and a > b)}
    pairs |= {(name, name) for name in names}
    gram = plan({name: reader.width(name) for name in names}, sorted(pairs), reader.num_rows,
                budget, accumulate)
    via_gram = {p for p in pairs if p[0] in gram and p[1] in gram}
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


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` (into ``out``). On the CPU by numpy, whose BLAS call for a matrix times its own
    transpose is syrk, half the multiply-adds; torch makes every product a gemm."""
    if a.device.type != "cpu":
        return torch.mm(a, b, out=out)
    if out is None:
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    np.matmul(a.numpy(), b.numpy(), out=out.numpy())
    return out


def _row_room(reader: AlignedRows, names: Sequence[str], budget: int) -> int:
    # Blocks of rows never hold more than half of what the rows loaded whole in float64 would:
    # more makes no faster products, and the in-memory computation stays the larger one.
    whole = 8 * reader.num_rows * sum(reader.width(name) for name in names)
    return max(0, min(budget, whole // 2))


# --- features: D x D sums -------------------------------------------------------------------

def _feature_sums(reader: AlignedRows, pairs: set[Pair], budget: int) -> dict[Pair, KernelSums]:
    if not pairs:
        return {}
    widths = {name: reader.width(name) for pair in pairs for name in pair}
    sums: dict[Pair, KernelSums] = {}
    for group in _feature_passes(widths, sorted(pairs), budget // 2):
        names = list(dict.fromkeys(name for pair in group for name in pair))
        state = _FeaturePass(names, group, reader)
        room = _row_room(reader, names, budget - _feature_bytes(widths, group))
        # a block in float64, and the stored rows of its widest source as they are read (see
        # panel_rows)
        row = 8 * sum(widths[name] for name in names) + 16 * max(widths[name] for name in names)
        blocks = reader.blocks(names, max(1, room // row))
        source = BlockReader(reader, names, max(b - a for a, b in blocks), {})
        for start, stop in blocks:
            state.add(source.read(start, stop))
        sums.update(state.sums())
    return sums


def _feature_passes(widths: dict[str, int], pairs: list[Pair], budget: int
                    ) -> list[list[Pair]]:
    # pairs grouped so that each pass's sums fit in the budget; most runs need one pass
    passes: list[list[Pair]] = []
    for pair in pairs:
        if passes and _feature_bytes(widths, [*passes[-1], pair]) <= budget:
            passes[-1].append(pair)
        else:
            passes.append([pair])
    return passes


class _FeaturePass:
    """One pass over the blocks: for each source the sum of its shifted rows z, the sum of
    their squared norms q and ``Σ z q_mᵀ`` against every source m's norms; for each pair the
    cross products ``Σ z wᵀ``."""

    def __init__(self, names: list[str], pairs: list[Pair], reader: AlignedRows):
        self.names, self.pairs, self.n = names, pairs, 0
        device = reader.device

        def zeros(*shape):
            return torch.zeros(*shape, dtype=torch.float64, device=device)

        self.total = {name: zeros(reader.width(name)) for name in names}
        self.norms = zeros(len(names))
        self.norm_products = zeros(len(names), len(names))
        self.weighted = {name: zeros(reader.width(name), len(names)) for name in names}
        self.cross = {(a, b): zeros(reader.width(a), reader.width(b)) for a, b in pairs}
        self.product = torch.empty(max(c.numel() for c in self.cross.values()),
                                   dtype=torch.float64, device=device)

    def add(self, z: Rows) -> None:
        q = torch.stack([torch.linalg.vector_norm(z[name], dim=1) ** 2 for name in self.names],
                        1)
        self.n += len(q)
        self.norms += q.sum(0)
        self.norm_products += q.T @ q
        for name in self.names:
            self.total[name] += z[name].sum(0)
            self.weighted[name] += z[name].T @ q
        for a, b in self.pairs:  # numpy's product then added: faster than torch's addmm_
            product = self.product[:self.cross[(a, b)].numel()].view(self.cross[(a, b)].shape)
            self.cross[(a, b)] += matmul(z[a].T, z[b], out=product)  # syrk when a is b

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
    at = {name: i for i, name in enumerate(names)}
    n, device = reader.num_rows, reader.device
    row_sums = torch.zeros(len(names), n, dtype=torch.float64, device=device)
    diagonal = torch.zeros(len(names), n, dtype=torch.float64, device=device)
    inner = torch.zeros(len(names), len(names), dtype=torch.float64, device=device)
    rows = panel_rows(reader, names, _row_room(reader, names, budget - 16 * len(names) * n))
    kernels = torch.empty(len(names) * rows * rows, dtype=torch.float64, device=device)

    def visit(panel: tuple[int, int], block: tuple[int, int], zp: Rows, zb: Rows) -> None:
        (p0, p1), (b0, b1), same = panel, block, panel == block
        k = kernels[:len(names) * (p1 - p0) * (b1 - b0)].view(len(names), p1 - p0, b1 - b0)
        for i, name in enumerate(names):
            matmul(zp[name], zb[name].T, out=k[i])
        row_sums[:, p0:p1] += k.sum(2)
        if same:
            diagonal[:, p0:p1] = k.diagonal(dim1=1, dim2=2)
        else:  # the block below the diagonal is this one transposed
            row_sums[:, b0:b1] += k.sum(1)
        flat = k.view(len(names), -1)
        inner.add_(matmul(flat, flat.T), alpha=1.0 if same else 2.0)  # every pair's <K, L>

    each_block_pair(reader, names, rows, visit, {})
    found = {}
    for a, b in pairs:
        ra, rb, da, db = row_sums[at[a]], row_sums[at[b]], diagonal[at[a]], diagonal[at[b]]
        found[(a, b)] = KernelSums(n=n, kl=float(inner[at[a], at[b]]), rt=float(ra @ rb),
                                   dd=float(da @ db), rd=float(ra @ db), dr=float(da @ rb),
                                   sk=float(ra.sum()), sl=float(rb.sum()),
                                   tk=float(da.sum()), tl=float(db.sum()))
    return found


def panel_rows(reader: AlignedRows, names: Sequence[str], room: int) -> int:
    """Rows per panel such that a panel and a block in float64 (16 bytes a value), the stored
    rows of the widest source as they are read (16 bytes a value at most: float32 rows and,
    for scattered rows, the windows they are picked from) and one panel x block float64 matrix
    per source take about ``room`` bytes; evened out, so that the last panel is not a sliver."""
    width = sum(reader.width(name) for name in names)
    widest = max(reader.width(name) for name in names)
    a, b = 8.0 * len(names), 16.0 * (width + widest)
    rows = int((-b + math.sqrt(b * b + 4 * a * max(0, room))) / (2 * a))
    rows = max(1, min(reader.num_rows, rows))
    panels = math.ceil(reader.num_rows / rows)
    return math.ceil(reader.num_rows / panels)


def each_block_pair(reader: AlignedRows, names: Sequence[str], rows: int, visit: BlockPair,
                    shift: dict[str, np.ndarray], standardise: bool = False) -> None:
    """``visit((p0, p1), (b0, b1), zp, zb)`` for every pair of row blocks (panel, block) at or
    after the diagonal, with their shifted (or, with ``standardise``, per-row standardised)
    rows ``{name: (rows, width)}``, which are only valid during the call.

    The panel stays in memory while the later blocks stream past it, the last first: so the
    block read last is the next panel, and is not read again. ``shift`` is filled with the
    mean of the first panel's rows when empty.
    """
    blocks = list(blocks_of(reader.num_rows, rows))
    source = BlockReader(reader, names, rows, shift, standardise, buffers=2)
    panel_buffer = 0
    zp = source.read(*blocks[0], panel_buffer)
    for i, (p0, p1) in enumerate(blocks):
        visit((p0, p1), (p0, p1), zp, zp)
        zb = zp
        for b0, b1 in reversed(blocks[i + 1:]):
            zb = source.read(b0, b1, 1 - panel_buffer)
            visit((p0, p1), (b0, b1), zp, zb)
        if zb is not zp:  # the last block read is the next panel
            zp, panel_buffer = zb, 1 - panel_buffer


class BlockReader:
    """Positions ``start:stop`` of each source, flattened, float64 on the reader's device: less
    ``shift[name]`` (filled with the first block's mean when missing) or, with ``standardise``,
    each row to mean 0 and norm 1 over its own features.

        source = BlockReader(reader, names, rows, shift)
        z = source.read(0, 100)   # {name: (100, width)}, valid until the next read

    Blocks land in buffers cut from one allocation, made once: blocks of tens of MiB made and
    freed again and again stay in the heap, fragmented, and the process grows past its budget,
    while one large allocation is mapped and given back whole. numpy converts and shifts the
    stored rows in one pass, several times faster than torch's conversion and subtraction.
    """

    def __init__(self, reader: AlignedRows, names: Sequence[str], rows: int,
                 shift: dict[str, np.ndarray], standardise: bool = False, buffers: int = 1):
        self.reader, self.names, self.shift, self.standardise = reader, names, shift, standardise
        widths = [reader.width(name) for name in names]
        stored = rows * max(widths)  # the stored rows as read, any dtype up to 8 bytes
        memory = np.empty(buffers * rows * sum(widths) + stored)
        self.staging = memory[:stored].view(np.uint8)
        self.buffers, at = [], stored
        for _ in range(buffers):
            self.buffers.append({})
            for name, width in zip(names, widths, strict=True):
                self.buffers[-1][name] = memory[at:at + rows * width].reshape(rows, width)
                at += rows * width

    def read(self, start: int, stop: int, buffer: int = 0) -> Rows:
        block = {}
        for name in self.names:
            stored = self._stored(name, self.reader.rows[name][start:stop])
            z = self.buffers[buffer][name][:stop - start]
            if self.standardise:
                z[:] = stored
                z -= z.mean(1, keepdims=True)
                z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-300)
            else:
                if name not in self.shift:
                    self.shift[name] = stored.mean(0, dtype=np.float64)
                np.subtract(stored, self.shift[name], out=z)
            block[name] = torch.from_numpy(z).to(self.reader.device)
        return block

    def _stored(self, name: str, rows: np.ndarray) -> np.ndarray:
        # the stored rows, flattened, in the staging buffer where they are in increasing order
        dataset = self.reader.dataset(name)
        n = len(rows)
        if not np.all(rows[1:] > rows[:-1]):  # another order: read as stats reads any rows
            return read_rows(dataset, rows).reshape(n, -1)
        size = n * self.reader.width(name) * dataset.dtype.itemsize
        into = self.staging[:size].view(dataset.dtype).reshape(n, *dataset.shape[1:])
        if rows[-1] - rows[0] + 1 == n:
            dataset.read_direct(into, np.s_[rows[0]:rows[-1] + 1])
        else:  # scattered: windows of n file rows read whole, several times faster than
            i = 0  # h5py's selection of the rows themselves, and the rows picked from them
            while i < n:
                j = int(np.searchsorted(rows, rows[i] + n))
                into[i:j] = dataset[rows[i]:rows[j - 1] + 1][rows[i:j] - rows[i]]
                i = j
        return into.reshape(n, -1)
