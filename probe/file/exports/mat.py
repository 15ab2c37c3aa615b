"""``to=mat``: ``D/<file stem>.mat``, MATLAB's v5 format, which ``scipy.io.loadmat`` and
MATLAB's ``load`` read.

A variable per key, named by the key with every character other than letters, digits and
``_`` as ``_`` (``layer4/output`` -> ``layer4_output``; a name that does not start with a
letter gets an ``x``; one over MATLAB's 63 characters, or one that two keys would share, is cut
and ends in a short hash of the key), and ``index``, ``target`` and the file's other numeric
bookkeeping (``offsets``, ``input_ids``, ...); text datasets (``file``, ``completion``) as cell
arrays of strings. Shapes are numpy's: a ``(N, 512)`` key is an N x 512 matrix, rows first, as
``scipy.io.savemat`` would write it; 1-d datasets are columns (N x 1). bfloat16 and float16 rows
are single; booleans are logical.

``scipy.io.savemat`` writes the file's header and the text variables; the numeric ones are
written here, element by element in the same bytes as savemat's (a test compares them), but
block by block: savemat takes a whole array in memory. MATLAB stores a matrix column by column,
so each block of rows lands as a run of bytes in every column. v5 holds at most 2 GiB a
variable: a larger key is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from probe.errors import ConfigError
from probe.file.exports.stream import Source

__all__ = ["MatExport", "matlab_names", "write_variable", "MAX_VARIABLE_BYTES"]

MAX_VARIABLE_BYTES = 2**31 - 1  # MATLAB's limit for a v5 variable
_NAME_LENGTH = 63  # MATLAB's namelengthmax
# numpy type -> (miTYPE of the data, mxCLASS of the matrix), as scipy.io.matlab writes them
_TYPES = {"f8": (9, 6), "f4": (7, 7), "i8": (12, 14), "i4": (5, 12), "i2": (3, 10),
          "i1": (1, 8), "u8": (13, 15), "u4": (6, 13), "u2": (4, 11), "u1": (2, 9),
          "b1": (2, 9)}  # booleans: a uint8 matrix with the logical flag
_MI_MATRIX, _MI_INT8, _MI_INT32, _MI_UINT32 = 14, 1, 5, 6


class MatExport:
    """The keys and bookkeeping of ``source`` as the variables of one v5 MAT-file.

    Raises:
        ConfigError: a key over the 2 GiB of a v5 variable.
    """

    def __init__(self, source: Source):
        self.source = source
        self.names = matlab_names([*source.bookkeeping, *source.keys])
        for key in self.names:
            if source.is_text(key):
                continue
            dtype = source.dtype(key)
            if dtype.str[1:] not in _TYPES and dtype != np.float16:
                raise ConfigError(f"to=mat cannot write {key!r} of type {dtype}: MATLAB v5 has "
                                  "no such type; leave it out with keys=[...], or export to=npy")
            size = _variable_bytes(source, key)
            if size > MAX_VARIABLE_BYTES:
                leave = "leave it out with keys=[...], or " if key in source.keys else ""
                raise ConfigError(
                    f"to=mat: {key!r} holds {size / 2**30:.1f} GiB, more than the 2 GiB of a "
                    f"MATLAB v5 variable; {leave}read it from the HDF5 file in MATLAB: "
                    f"h5read('{source.path.name}', '/{key}')")

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int]]:
        from scipy.io import savemat

        path = Path(f"{self.source.path.stem}.mat")
        texts = {}
        with (folder / path).open("w+b") as stream:
            savemat(stream, {})  # the 128-byte header
            for name, variable in self.names.items():
                if self.source.is_text(name):
                    texts[variable] = name
                    continue
                # half the budget a block: its column-major copy sits beside it
                write_variable(stream, variable, self.source.dtype(name),
                               self.source[name].shape, self.source.blocks(name, budget // 2))
            for variable, name in texts.items():  # a cell per string: small, one per sample
                values = np.empty(self.source.rows(name), dtype=object)
                values[:] = list(self.source[name].asstr()[:])
                savemat(stream, {variable: values.reshape(-1, 1)})
        return [(path, self.source.rows(self.source.keys[0]))]


def matlab_names(keys: list[str]) -> dict[str, str]:
    """Each key's MATLAB variable name: a letter first, then letters, digits and ``_``, at
    most 63 characters, one name a key."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for key in keys:
        name = re.sub(r"[^A-Za-z0-9_]", "_", key)
        if not name[:1].isalpha():
            name = "x" + name
        if len(name) > _NAME_LENGTH or name in taken:
            digest = hashlib.sha1(key.encode()).hexdigest()[:8]
            name = f"{name[:_NAME_LENGTH - 9]}_{digest}"
        names[key] = name
        taken.add(name)
    return names


def write_variable(stream, name: str, dtype: np.dtype, shape: tuple[int, ...], blocks) -> None:
    """A numeric matrix element of ``shape`` named ``name`` at the stream's position, its data
    from ``blocks``: ``(first row, rows)`` in order, covering every row once."""
    dtype = np.dtype("f4") if dtype == np.float16 else np.dtype(dtype)
    mi_type, mx_class = _TYPES[dtype.str[1:]]
    dims = ((shape[0], 1) if shape[0] else (0, 0)) if len(shape) == 1 else shape  # savemat's
    store = np.dtype("u1") if dtype == np.bool_ else dtype
    data_bytes = int(np.prod(shape, dtype=np.int64)) * store.itemsize
    header = b"".join([
        np.array([_MI_UINT32, 8, mx_class | (0x02 << 8 if dtype == np.bool_ else 0), 0],
                 "=u4").tobytes(),
        _element(_MI_INT32, np.array(dims, "=i4").tobytes()),
        _element(_MI_INT8, name.encode("latin1"))])
    if data_bytes <= 4:  # savemat packs data this small into its tag
        rows = [np.asarray(b, dtype=store) for _, b in blocks]
        data = (np.concatenate(rows) if rows else np.zeros(shape, store)).tobytes(order="F")
        header += _element(mi_type, data)
        stream.write(np.array([_MI_MATRIX, len(header)], "=u4").tobytes() + header)
        return
    header += np.array([mi_type, data_bytes], "=u4").tobytes()
    total = len(header) + data_bytes + (-data_bytes % 8)
    stream.write(np.array([_MI_MATRIX, total], "=u4").tobytes() + header)
    stream.flush()
    start = stream.tell()
    _write_columns(stream.fileno(), start, shape, store, blocks)
    stream.seek(start + data_bytes)
    stream.write(b"\0" * (-data_bytes % 8))


def _write_columns(fd: int, start: int, shape: tuple[int, ...], dtype: np.dtype, blocks
                   ) -> None:
    # MATLAB's order is column-major: element (r, j) of the rows-by-features matrix is at
    # r + j * rows, with j the feature's column-major place; a block of rows is one run of
    # bytes in each feature's column. The block is transposed (rows last) and each feature's
    # run written where its column lies: numpy's own transposing copy of an (N, C, H, W) block
    # is several times slower than this one, in tiles that stay in the cache.
    rows, size = shape[0], dtype.itemsize
    column = np.arange(int(np.prod(shape[1:], dtype=np.int64))).reshape(shape[1:], order="F")
    column = column.reshape(-1)  # a feature's place in C order -> its column in MATLAB's
    for first, block in blocks:
        block = np.asarray(block, dtype=dtype)
        if block.ndim == 1:
            os.pwrite(fd, np.ascontiguousarray(block).data, start + first * size)
        else:
            places = (start + (column * rows + first) * size).tolist()
            for run, place in zip(_transposed(block.reshape(len(block), -1)), places,
                                  strict=True):
                os.pwrite(fd, run.data, place)
        del block  # before the next block is read


def _transposed(block: np.ndarray, tile: int = 128) -> np.ndarray:
    # (B, D) as (D, B), C-ordered, copied a tile at a time
    out = np.empty(block.shape[::-1], dtype=block.dtype)
    for i in range(0, block.shape[0], tile):
        for j in range(0, block.shape[1], tile):
            out[j:j + tile, i:i + tile] = block[i:i + tile, j:j + tile].T
    return out


def _element(mi_type: int, data: bytes) -> bytes:
    # a data element: data of at most 4 bytes packs into its tag (the "small" form)
    if len(data) <= 4:
        return np.array([(len(data) << 16) | mi_type], "=u4").tobytes() + data.ljust(4, b"\0")
    return (np.array([mi_type, len(data)], "=u4").tobytes() + data
            + b"\0" * (-len(data) % 8))


def _variable_bytes(source: Source, key: str) -> int:
    dtype = source.dtype(key)
    itemsize = 4 if dtype == np.float16 else dtype.itemsize
    return itemsize * int(np.prod(source[key].shape, dtype=np.int64))
