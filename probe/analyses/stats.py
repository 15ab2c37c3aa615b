"""What the analyses (probe.analyses.compare, probe.analyses.encode) share: which stored keys,
in the model's order; which rows of two sources hold the same samples; and those rows, read from
the file in blocks of a memory budget, as float64 tensors on the analysis device.

    keys = select_keys(f, ["layer3", "fc/output"])   # "<layer>/<kind>"s, model order
    rows_a, rows_b = match_index(f.index, g.index)   # the samples both hold, in f's order
    reader = AlignedRows({"a": (f, "fc/output"), "b": (g, "fc/output")},
                         {"a": rows_a, "b": rows_b}, device)
    for start, stop in reader.blocks(["a", "b"], rows):
        x = reader.read(start, stop, ["a", "b"])      # {"a": (B, Da), "b": (B, Db)}, aligned

Position k of every source is the same sample, so sums over positions are sums over samples.
Each block is read in a few contiguous HDF5 ranges (whole chunks when the rows are contiguous),
never row by row, and a block's bytes stay under the budget: nothing ever holds a whole dataset.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from probe.config.device import resolve_device
from probe.errors import ConfigError, DataError
from probe.file.format import KINDS, Attr, split_key
from probe.file.read import FeatureFile

__all__ = ["select_keys", "model_order", "match_index", "AlignedRows", "read_rows",
           "row_width", "blocks_of", "budget_bytes", "analysis_device", "MIB",
           "working_budget", "memory_mb_for"]

MIB = 1 << 20
# what numpy's BLAS, torch and HDF5 allocate on their first use, outside the arrays that an
# analysis counts (23 MiB measured): left out of a budget, at most a quarter of it
_LIBRARIES = 32 * MIB


def select_keys(f: FeatureFile, keys: Sequence[str] | str | None, *, name: str = "keys"
                ) -> list[str]:
    """The "<layer>/<kind>"s that ``keys`` names, in the model's order when ``keys`` is None.

    Args:
        f: the open file.
        keys: "<layer>/<kind>"s, or "<layer>"s for all of a layer's kinds; None for every
            stored dataset.
        name: the option that gave ``keys``, for the error message.

    Raises:
        ConfigError: a key is not in the file (the message says which run would store it), or
            the file holds no layer datasets.
    """
    if keys is None:
        if not f.features:
            raise ConfigError(f"{str(f.path)!r} holds no layer datasets; run probe with layers")
        return sorted(f.features, key=model_order(f))
    selected: list[str] = []
    for key in map(str, [keys] if isinstance(keys, str) else keys):
        if "/" not in key and f.kinds(key):
            selected += sorted((f"{key}/{kind}" for kind in f.kinds(key)), key=model_order(f))
        else:
            try:
                f.require(key if "/" in key else f"{key}/output")
            except ConfigError as err:
                raise ConfigError(f"{name}: {err}") from None
            selected.append(key if "/" in key else f"{key}/output")
    if not selected:
        raise ConfigError(f"{name}=[] names no dataset; leave it out for every stored one")
    return list(dict.fromkeys(selected))


def model_order(f: FeatureFile):
    """A sort key: layers as the run's ``layers`` attr lists them (HDF5 lists groups
    alphabetically), outputs before gradients."""
    layers = [str(name) for name in f.attrs.get(Attr.LAYERS, [])]
    kinds = list(KINDS)

    def position(key: str) -> tuple[int, int, str]:
        layer, kind = split_key(key)
        base = kind.rstrip("_0123456789") if kind not in kinds else kind
        return (layers.index(layer) if layer in layers else len(layers),
                kinds.index(base) if base in kinds else len(kinds), kind)
    return position


def match_index(index_a: np.ndarray, index_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of two sources that hold the same dataset samples, by their ``/index``.

    Returns:
        ``(rows_a, rows_b)``: ``index_a[rows_a] == index_b[rows_b]``, in the order of the
        rows of ``a`` (so ``rows_a`` increases); empty arrays when no sample is shared.

    Raises:
        DataError: an index names one sample twice.
    """
    for label, index in (("first", index_a), ("second", index_b)):
        if len(np.unique(index)) != len(index):
            raise DataError(f"the {label} file's /index holds a sample twice; a probe file has "
                            "one row per sample: was it written by hand?")
    _, rows_a, rows_b = np.intersect1d(index_a, index_b, assume_unique=True,
                                       return_indices=True)
    order = np.argsort(rows_a, kind="stable")
    return rows_a[order].astype(np.int64), rows_b[order].astype(np.int64)


def row_width(dataset) -> int:
    """The number of values in one row of a dataset (its rows are flattened for analysis)."""
    return int(math.prod(dataset.shape[1:]))


def read_rows(dataset, rows: np.ndarray) -> np.ndarray:
    """``dataset[rows]`` for any row numbers (unique, in any order), read in as few HDF5
    selections as the rows allow: one contiguous range where they are dense, else one
    selection of exactly those rows (h5py wants them increasing; they are put back after)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == 0:
        return np.zeros((0, *dataset.shape[1:]), dtype=dataset.dtype)
    order = None if np.all(rows[1:] > rows[:-1]) else np.argsort(rows, kind="stable")
    ascending = rows if order is None else rows[order]
    start, stop = int(ascending[0]), int(ascending[-1]) + 1
    if stop - start == len(ascending):
        values = dataset[start:stop]
    elif stop - start <= 2 * len(ascending):  # a span at most twice the rows: read it whole
        values = dataset[start:stop][ascending - start]
    else:
        values = dataset[ascending]
    if order is None:
        return values
    restored = np.empty_like(values)
    restored[order] = values
    return restored


class AlignedRows:
    """Stored datasets whose rows ``rows[name][k]`` all hold sample k: read together, block
    by block, as float64 tensors of flattened rows on ``device``.

    Example::

        reader = AlignedRows({"a": (fa, "fc/output"), "b": (fb, "fc/output")},
                             {"a": rows_a, "b": rows_b}, torch.device("cpu"))
        for start, stop in reader.blocks(["a", "b"], 4096):
            block = reader.read(start, stop, ["a", "b"])

    Each read opens its dataset afresh: an open h5py dataset keeps a chunk cache of its own,
    which grows to a few chunks, for every key at once.
    """

    def __init__(self, sources: Mapping[str, tuple[FeatureFile, str]],
                 rows: Mapping[str, np.ndarray], device: torch.device):
        self.sources, self.device = dict(sources), device
        self.rows = {name: np.asarray(rows[name], dtype=np.int64) for name in self.sources}
        lengths = {len(r) for r in self.rows.values()}
        assert len(lengths) == 1, "every source needs one row per position"
        self.num_rows = lengths.pop()
        self._widths = {name: row_width(self.dataset(name)) for name in self.sources}

    def dataset(self, name: str):
        """The source's dataset, opened now (close it by dropping it)."""
        f, key = self.sources[name]
        return f[key]

    def width(self, name: str) -> int:
        return self._widths[name]

    def subset(self, positions: np.ndarray) -> AlignedRows:
        """The same sources at these positions only, in this order."""
        return AlignedRows(self.sources, {name: rows[positions] for name, rows in
                                          self.rows.items()}, self.device)

    def blocks(self, names: Sequence[str], rows: int) -> list[tuple[int, int]]:
        """``(start, stop)`` ranges of at most ``rows`` positions: whole chunks of the first
        source where ``rows`` holds at least one."""
        chunks = getattr(self.dataset(names[0]), "chunks", None)
        chunk = chunks[0] if chunks else 1
        rows = max(1, min(rows, self.num_rows))
        if rows >= chunk:
            rows -= rows % chunk
        return list(blocks_of(self.num_rows, rows))

    def read(self, start: int, stop: int, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The positions ``start:stop`` of each source in ``names``: (stop - start, width)."""
        return {name: self._tensor(read_rows(self.dataset(name), self.rows[name][start:stop]))
                for name in names}

    def _tensor(self, values: np.ndarray) -> torch.Tensor:
        x = torch.from_numpy(np.ascontiguousarray(values)).reshape(len(values), -1)
        return x.to(device=self.device, dtype=torch.float64)


def blocks_of(positions: int, rows: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` ranges of ``rows`` positions (the last may be short)."""
    for start in range(0, positions, max(1, rows)):
        yield start, min(start + rows, positions)


def analysis_device(spec: str) -> torch.device:
    """``resolve_device(spec)`` for the analyses, whose sums are float64 (which MPS lacks).

    Raises:
        ConfigError: not a device name, or mps.
        DeviceError: the device is not available here.
    """
    device = resolve_device(spec)
    if device.type == "mps":
        raise ConfigError("device=mps has no float64, which these sums need; use cpu or cuda")
    return device


def budget_bytes(memory_mb: float, *, option: str = "memory_mb") -> int:
    """``memory_mb`` in bytes, checked.

    Raises:
        ConfigError: not a positive number.
    """
    if not float(memory_mb) > 0:
        raise ConfigError(f"{option}={memory_mb} must be a positive number of MiB, e.g. 1024")
    return int(float(memory_mb) * MIB)


def working_budget(budget: int) -> int:
    """What an analysis may hold of ``budget`` bytes: less what the libraries allocate on
    their own (32 MiB, at most a quarter of the budget)."""
    return budget - min(_LIBRARIES, budget // 4)


def memory_mb_for(need: int) -> float:
    """The smallest ``memory_mb`` whose ``working_budget`` holds ``need`` bytes: for the
    one-line errors."""
    return min(need * 4 / 3, need + _LIBRARIES) / MIB
