"""Streaming the rows of one stored dataset in batches, a few HDF5 chunks at a time.

``FeatureFile.loader(key)`` returns a ``RowLoader``; use it where the rows do not fit in memory:

    with probe.open(path) as f:
        for x, y in f.loader("layer4/output", batch_size=256, shuffle=True, seed=0):
            ...                     # x: (B, *row shape) tensor, y: (B,) int64 targets or None

Reads always cover whole chunks (``row_blocks``): random single-row reads from a chunked HDF5
dataset would decompress a chunk for every row. Shuffling permutes the blocks, then the rows
inside a buffer of several blocks (``buffer_bytes``), so memory stays bounded by that buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import h5py
import numpy as np
import torch

__all__ = ["RowLoader", "TokenTargets", "row_blocks"]


def row_blocks(dataset: h5py.Dataset, num_rows: int, min_rows: int = 1) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` row ranges that together cover ``num_rows`` rows.

    Each range holds whole chunks of ``dataset`` along its row axis (the last may be short) and
    at least ``min_rows`` rows, so reading one range decompresses each of its chunks once. A
    dataset without chunks (contiguous, or virtual as ``probe.file.merge`` writes) is read in ranges
    of ``min_rows``.
    """
    chunk = dataset.chunks[0] if dataset.chunks else 1
    block = chunk * max(1, math.ceil(min_rows / chunk))
    return [(start, min(start + block, num_rows)) for start in range(0, num_rows, block)]


class RowLoader:
    """Batches ``(x, y)`` of one dataset's rows; ``y`` is None when the file has no targets.

    Example::

        loader = RowLoader(f["layer4/output"], f.target, num_rows=len(f.index), batch_size=64)
        for x, y in loader:         # a new shuffle each pass when shuffle=True
            ...

    Every pass yields each selected row once; all batches but the last hold ``batch_size``
    rows. Without ``shuffle`` the rows come in file order. With it, pass ``e`` (0, 1, ...) of a
    loader is the same for the same ``seed``, so training on it is reproducible.
    """

    def __init__(self, dataset: h5py.Dataset, target: np.ndarray | None, *, num_rows: int,
                 batch_size: int = 256, shuffle: bool = False, seed: int = 0,
                 rows: Sequence[int] | np.ndarray | None = None, buffer_bytes: int = 256 << 20):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1")
        self.dataset, self.target = dataset, target
        self.batch_size, self.shuffle, self.seed = int(batch_size), bool(shuffle), int(seed)
        self.mask = _row_mask(rows, num_rows)
        self.num_selected = int(self.mask.sum())
        self.blocks = [(a, b) for a, b in row_blocks(dataset, num_rows, self.batch_size)
                       if self.mask[a:b].any()]
        row_bytes = dataset.dtype.itemsize * math.prod(dataset.shape[1:])
        self.rows_per_buffer = max(1, int(buffer_bytes) // max(1, row_bytes))
        self.epoch = 0  # counts passes, so that each pass of a shuffled loader differs

    def __len__(self) -> int:
        return math.ceil(self.num_selected / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        blocks = ([self.blocks[i] for i in rng.permutation(len(self.blocks))]
                  if self.shuffle else self.blocks)
        carry_x, carry_y = None, None
        for group in self._buffers(blocks):
            x, y = self._read(group)
            if self.shuffle:
                order = rng.permutation(len(x))
                x, y = x[order], None if y is None else y[order]
            if carry_x is not None:
                x = np.concatenate([carry_x, x])
                y = None if y is None else np.concatenate([carry_y, y])
            full = len(x) - len(x) % self.batch_size
            for start in range(0, full, self.batch_size):
                yield _batch(x[start:start + self.batch_size],
                             None if y is None else y[start:start + self.batch_size])
            carry_x, carry_y = x[full:], None if y is None else y[full:]
        if carry_x is not None and len(carry_x):
            yield _batch(carry_x, carry_y)

    def _buffers(self, blocks: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        # groups of blocks whose rows fit in one buffer (a block larger than that goes alone)
        group: list[tuple[int, int]] = []
        size = 0
        for block in blocks:
            rows = block[1] - block[0]
            if group and size + rows > self.rows_per_buffer:
                yield group
                group, size = [], 0
            group.append(block)
            size += rows
        if group:
            yield group

    def _read(self, group: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray | None]:
        xs, ys = [], []
        for start, stop in _merge_adjacent(group):
            keep = self.mask[start:stop]
            xs.append(self.dataset[start:stop][keep])
            if self.target is not None:
                ys.append(self.target[start:stop][keep])
        return np.concatenate(xs), (np.concatenate(ys) if self.target is not None else None)


class TokenTargets:
    """Per-token targets, without a copy per token: row r's target is that of the sample whose
    token rows ``offsets[i]:offsets[i+1]`` hold r. Slice it as an array of length offsets[-1]."""

    def __init__(self, target: np.ndarray, offsets: np.ndarray):
        self.target, self.offsets = target, offsets

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(len(self))
        samples = np.searchsorted(self.offsets, np.arange(start, stop), side="right") - 1
        return self.target[samples]


def _row_mask(rows, num_rows: int) -> np.ndarray:
    mask = np.zeros(num_rows, dtype=bool)
    if rows is None:
        mask[:] = True
        return mask
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        bad = rows[(rows < 0) | (rows >= num_rows)][0]
        raise IndexError(f"row {bad} is out of range: the file has {num_rows} rows")
    mask[rows] = True
    return mask


def _merge_adjacent(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    # one read for a run of neighbouring blocks (the unshuffled case reads the buffer at once)
    merged: list[tuple[int, int]] = []
    for start, stop in blocks:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _batch(x: np.ndarray, y: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.from_numpy(np.ascontiguousarray(x)), (
        None if y is None else torch.from_numpy(y.astype(np.int64, copy=False)))
