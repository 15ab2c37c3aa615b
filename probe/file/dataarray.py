"""A stored dataset as a lazy ``xarray.DataArray``: ``probe.open(path).to_xarray(key)``.

    with probe.open("feats/gpt2.h5") as f:
        x = f.to_xarray("transformer.h.6/output")     # reads nothing yet
        x.dims                                         # ('token', 'feature')
        x.where(x.document == 3, drop=True).mean("token").values    # reads what it needs

The dims are the file's own (each dataset's ``dims`` attr); the coordinates lie along the
first: for rows per sample ``index`` and, where the file has them, ``target``, ``file``,
``caption``, ``transcript``, ``completion``; for rows per token (or frame) ``sample`` (the
row of /index its sample has, from /offsets), that sample's ``index`` and ``target``, and the
token's own ``input_ids``, ``positions``, ``document``, ``generated``, ``modality``, and a
vision-language model's ``patch_row`` and ``patch_column`` (its place on its image's patch grid,
-1 for text).

Nothing is read when the array is made: the data and every coordinate are xarray's lazily
indexed backend arrays (``xarray.backends.BackendArray`` under
``xarray.core.indexing.LazilyIndexedArray`` and ``CopyOnWriteArray``, as xarray's own netCDF
and HDF5 backends wrap their variables), so indexing composes lazily and only ``.values``,
``.load()`` or a computation reads, and then only the rows indexed. No dask is needed. The
array reads through the open file: use it inside the ``with`` block, or ``.load()`` it first.
"""

from __future__ import annotations

from collections.abc import Mapping

import h5py
import numpy as np
import xarray as xr
from xarray.backends import BackendArray
from xarray.core import indexing

from probe.file.format import (
    CAPTION,
    COMPLETION,
    DECODER_INPUT_IDS,
    DECODER_OFFSETS,
    DOCUMENT,
    FILE,
    GENERATED,
    INDEX,
    INPUT_IDS,
    OFFSETS,
    PATCH,
    POSITIONS,
    TARGET,
    TRANSCRIPT,
    Attr,
    bounds_of,
)

__all__ = ["data_array"]

# coordinates of rows per sample, and of rows per token, where the file has them
SAMPLE_COORDS = (INDEX, TARGET, FILE, CAPTION, TRANSCRIPT, COMPLETION)
TOKEN_COORDS = (INPUT_IDS, POSITIONS, DOCUMENT, GENERATED, "modality")
# an encoder-decoder's decoder rows, which /decoder_offsets bounds, each by its bounds
BOUNDED_COORDS = {OFFSETS: TOKEN_COORDS, DECODER_OFFSETS: (DECODER_INPUT_IDS,)}


def data_array(f: Mapping, key: str) -> xr.DataArray:
    """``key`` of ``f``, an open ``probe.open`` file, as a lazy DataArray (see the module's
    docstring)."""
    dataset = f[key]
    per_token = f.per_token(key)
    rows = int(f.offsets_of(key)[-1]) if per_token else f.num_rows
    dims = _dims(dataset, per_token)

    def lazy(array):
        # as xarray's own backends wrap theirs: a copy of the DataArray shares the file
        return indexing.CopyOnWriteArray(indexing.LazilyIndexedArray(array))

    coords = {}
    if per_token:
        bounded_by = bounds_of(dataset.attrs)
        bounds = _Offsets(f._file[bounded_by], f.num_rows)
        coords["sample"] = (dims[0], lazy(_SampleOfRow(bounds, rows)))
        for name in (INDEX, TARGET):
            if name in f:
                coords[name] = (dims[0], lazy(_PerSample(_Rows(f[name], f.num_rows), bounds,
                                                         rows)))
        names = BOUNDED_COORDS.get(bounded_by, ())
    else:
        names = SAMPLE_COORDS
    for name in names:
        if name in f and f[name].ndim == 1 and len(f[name]) >= rows:
            coords[name] = (dims[0], lazy(_Rows(f[name], rows)))
    if per_token and bounded_by == OFFSETS and PATCH in f and len(f[PATCH]) >= rows:
        # a token row's place on its image's patch grid (-1 for text): a coordinate each
        for column, name in enumerate(("patch_row", "patch_column")):
            coords[name] = (dims[0], lazy(_Column(_Rows(f[PATCH], rows), column)))
    attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v)
             for k, v in dataset.attrs.items() if k != Attr.DIMS}
    variable = xr.Variable(dims, lazy(_Rows(dataset, rows)), attrs=attrs)
    return xr.DataArray(variable, coords={n: xr.Variable(*c) for n, c in coords.items()},
                        name=key)


def _dims(dataset, per_token: bool) -> tuple[str, ...]:
    dims = [str(d) for d in dataset.attrs.get(Attr.DIMS, [])]
    if len(dims) != dataset.ndim:  # a file older than the dims attr
        dims = ["token" if per_token else "sample",
                *(f"axis_{n}" for n in range(1, dataset.ndim))]
    return tuple(dims)


class _Lazy(BackendArray):
    """What every array here shares: outer indexing (one vector per key at most, as h5py takes
    it), the rest done in numpy by xarray."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __getitem__(self, key):
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER_1VECTOR, self._read)

    def _read(self, key: tuple) -> np.ndarray:
        raise NotImplementedError


class _Rows(_Lazy):
    """The first ``rows`` rows of an h5py dataset (or probe's bfloat16 view of one)."""

    def __init__(self, dataset, rows: int):
        self.dataset, self.shape = dataset, (rows, *dataset.shape[1:])
        self.text = h5py.check_string_dtype(getattr(dataset, "dtype", None)) is not None
        self.dtype = np.dtype(object) if self.text else np.dtype(dataset.dtype)

    def _read(self, key: tuple) -> np.ndarray:
        reader = self.dataset.asstr() if self.text else self.dataset
        key = tuple(key) + (slice(None),) * (len(self.shape) - len(key))
        key = tuple(slice(*k.indices(n)) if isinstance(k, slice) else k
                    for k, n in zip(key, self.shape, strict=True))
        # h5py takes one list of increasing, distinct indices: read those, then reorder
        vector = next((n for n, k in enumerate(key) if isinstance(k, np.ndarray)), None)
        if vector is None:
            return np.asarray(reader[key])
        wanted = np.asarray(key[vector]) % self.shape[vector]
        unique, back = np.unique(wanted, return_inverse=True)
        found = np.asarray(reader[key[:vector] + (unique,) + key[vector + 1:]])
        return np.take(found, back, axis=sum(not isinstance(k, int) for k in key[:vector]))


class _Column(_Lazy):
    """One column of a two-column dataset's rows (/patch: row and column on the grid)."""

    def __init__(self, rows: _Rows, column: int):
        self.rows, self.column = rows, column
        self.shape, self.dtype = rows.shape[:1], rows.dtype

    def _read(self, key: tuple) -> np.ndarray:
        return self.rows._read((key[0], self.column))


class _Offsets:
    """/offsets, read once when a coordinate first needs it (N + 1 int64s)."""

    def __init__(self, dataset: h5py.Dataset, samples: int):
        self.dataset, self.samples, self._values = dataset, samples, None

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = self.dataset[: self.samples + 1]
        return self._values

    def sample_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.values, rows, side="right") - 1


class _SampleOfRow(_Lazy):
    """Each token row's sample: its row of /index."""

    def __init__(self, bounds: _Offsets, rows: int):
        self.bounds, self.shape, self.dtype = bounds, (rows,), np.dtype(np.int64)

    def _read(self, key: tuple) -> np.ndarray:
        return self.bounds.sample_of(np.arange(self.shape[0])[key[0]])


class _PerSample(_Lazy):
    """A value per sample (index, target), given to each of its token rows."""

    def __init__(self, values: _Rows, bounds: _Offsets, rows: int):
        self.values, self.bounds = values, bounds
        self.shape, self.dtype = (rows,), values.dtype

    def _read(self, key: tuple) -> np.ndarray:
        samples = self.bounds.sample_of(np.arange(self.shape[0])[key[0]])
        if not samples.size:
            return np.zeros(0, self.dtype)
        first, last = int(samples.min()), int(samples.max()) + 1
        return self.values._read((slice(first, last),))[samples - first]

