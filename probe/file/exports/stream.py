"""What every export shares: the finished file it reads, the keys asked for, and the rows of a
dataset in blocks of a byte budget, so that an export holds one block at a time however large
the file is.

    with Source("feats/gpt2.h5", keys=["transformer.h.6"]) as source:
        for start, block in source.blocks("transformer.h.6/output", budget=256 << 20):
            ...                     # rows start:start + len(block), as float32 for bfloat16

Blocks cover whole HDF5 chunks (probe.file.rows.row_blocks), so each chunk is decompressed
once. Bookkeeping of one value per sample (``/offsets``) is read whole where a route needs it:
8 bytes a sample, a small part of the rows it bounds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from probe.file.format import OFFSETS, ROWS_PER_POSITION, Attr, bounds_of
from probe.file.read import open_checked
from probe.file.rows import row_blocks

__all__ = ["Source", "row_bytes", "json_attrs"]


class Source:
    """A finished probe file opened for an export (a context manager that closes it).

    Raises:
        DataError: no such file, or not a probe file.
        OutputError: the run that writes it has not finished (a partial file).
        ConfigError: a key (or layer) that the file does not hold.
    """

    def __init__(self, path: str | Path, keys: Sequence[str] | None = None):
        self.file = open_checked(path)
        try:
            self.keys = _select(self.file, keys)
        except BaseException:
            self.file.close()
            raise
        self.path = self.file.path

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc_info) -> None:
        self.file.close()

    def __getitem__(self, name: str):
        """The dataset, bfloat16 rows read as float32 (exactly)."""
        return self.file[name]

    def __contains__(self, name: str) -> bool:
        return name in self.file._file and isinstance(self.file._file[name], h5py.Dataset)

    @property
    def bookkeeping(self) -> list[str]:
        """The datasets at the file's root (index, target, offsets, input_ids, ...)."""
        return [name for name, obj in self.file._file.items() if isinstance(obj, h5py.Dataset)]

    def rows(self, name: str) -> int:
        return len(self[name])

    def per_token(self, name: str) -> bool:
        """Whether ``name`` holds a row per stored token (or frame), bounded by /offsets (or,
        an encoder-decoder's decoder rows, /decoder_offsets: ``bounds``)."""
        return self.bounds(name) in self and self[name].attrs.get(Attr.ROWS) == ROWS_PER_POSITION

    def bounds(self, name: str) -> str:
        """The dataset that bounds ``name``'s rows per token, where it has them."""
        return bounds_of(self[name].attrs)

    def is_text(self, name: str) -> bool:
        return h5py.check_string_dtype(self.file._file[name].dtype) is not None

    def dtype(self, name: str) -> np.dtype:
        """The type an export writes: the stored one, float32 for bfloat16 bits."""
        return np.dtype(object) if self.is_text(name) else np.dtype(self[name].dtype)

    def offsets(self, bounds: str = OFFSETS) -> np.ndarray:
        return self.file._file[bounds][:]

    def blocks(self, name: str, budget: int, start: int = 0, stop: int | None = None
               ) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, rows)`` of rows ``start:stop``, about ``budget`` bytes a block (at
        least one chunk); text as Python strings."""
        dataset = self[name]
        stop = len(dataset) if stop is None else stop
        reader = dataset.asstr() if self.is_text(name) else dataset
        per_block = max(1, budget // max(1, row_bytes(dataset)))
        for a, b in row_blocks(dataset, stop - start, per_block):
            yield start + a, np.asarray(reader[start + a:start + b])

    def aligned_blocks(self, names: Sequence[str], budget: int
                       ) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` ranges over rows that ``names`` share, ``budget`` bytes of all of
        them a range: a multiple of 32 rows where it can be (compressed chunks hold 32 rows
        or a power of two fewer, so each is read once)."""
        total = self.rows(names[0])
        step = max(1, budget // max(1, sum(row_bytes(self[n]) for n in names)))
        step = step - step % 32 if step >= 32 else step
        for start in range(0, total, step):
            yield start, min(total, start + step)


def row_bytes(dataset) -> int:
    """Bytes a row takes once read (float32 for bfloat16; a guess of 64 for text)."""
    itemsize = 64 if h5py.check_string_dtype(dataset.dtype) else dataset.dtype.itemsize
    return itemsize * int(np.prod(dataset.shape[1:], dtype=np.int64))


def json_attrs(attrs) -> dict:
    """HDF5 attrs as JSON values (numpy scalars and arrays as numbers and lists)."""
    def plain(value):
        if isinstance(value, np.ndarray):
            return [plain(v) for v in value.tolist()]
        if isinstance(value, (np.generic,)):
            return value.item()
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value
    return {str(key): plain(value) for key, value in attrs.items()}


def _select(f, keys: Sequence[str] | None) -> list[str]:
    # "<layer>/<kind>" as it is, "<layer>" as every kind it holds, in the order asked
    if keys is None:
        return list(f.features)
    chosen: dict[str, None] = {}
    for key in map(str, keys):
        if key in f.features:
            chosen[key] = None
        elif f.kinds(key):
            chosen.update((f"{key}/{kind}", None) for kind in f.kinds(key))
        else:
            f.require(key)  # raises, saying which run would have stored it
    return list(chosen)
