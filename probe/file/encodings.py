"""Rows stored in a type HDF5 has no name for, read back as float32: what ``probe.open(path)[key]``
hands out for such a dataset, so that every reader (the loader, xarray, the exports, compare,
encode, fit) sees floats.

    bfloat16   the raw 16 bits (uint16); a value is the bits shifted into a float32's high half,
               exactly
    float8     e4m3 bytes (uint8, dtype attr float8_e4m3fn) and, in "<layer>/<kind>_scale",
               one float32 scale per row (per query row of an attention pattern: the scale
               covers the row's last ``scaled_axes`` axes); a value is
               ``decode_table[byte] * scale``, the table (256 float32 values) in the attrs

The rule that wrote them (scale = max|row| / 448, 1.0 for a row of zeros; byte = the row
divided by its scale, rounded to e4m3) lives with the capture (probe.pipeline.compact);
this module only reads.
"""

from __future__ import annotations

import h5py
import numpy as np

from probe.file.format import Attr

__all__ = ["FLOAT8", "FLOAT8_MAX", "float8_table", "decode_float8", "decoded", "is_scale",
           "stored_as", "fidelity_words", "BFloat16Rows", "Float8Rows"]

FLOAT8 = "float8_e4m3fn"
FLOAT8_MAX = 448.0  # the largest finite e4m3 value: a row's largest magnitude is stored as it


def float8_table() -> np.ndarray:
    """The float32 value of each of the 256 e4m3 (fn: finite, no infinities) bytes: sign bit,
    4 exponent bits (bias 7), 3 mantissa bits; 0x7f and 0xff are NaN."""
    byte = np.arange(256, dtype=np.uint32)
    sign = np.where(byte & 0x80, -1.0, 1.0)
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    value = np.where(exponent == 0, mantissa / 8.0 * 2.0 ** -6,  # subnormal
                     (1 + mantissa / 8.0) * 2.0 ** (exponent.astype(np.float64) - 7))
    value = np.where((exponent == 0xF) & (mantissa == 0x7), np.nan, value)
    return (sign * value).astype(np.float32)


_TABLE = float8_table()


def decode_float8(data: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Float32 values of e4m3 bytes ``data`` whose leading axes are those of ``scale``."""
    scale = np.asarray(scale, dtype=np.float32)
    values = _TABLE[np.asarray(data, dtype=np.uint8)]
    return values * scale.reshape(scale.shape + (1,) * (values.ndim - scale.ndim))


def is_scale(dataset: h5py.Dataset) -> bool:
    """Whether ``dataset`` holds the scales of another's float8 rows (not rows of its own)."""
    return Attr.SCALE_OF in dataset.attrs


def decoded(dataset: h5py.Dataset):
    """``dataset``, or a view of it that reads float32 where its type is bfloat16 or float8."""
    dtype = dataset.attrs.get(Attr.DTYPE)
    if dtype == "bfloat16" and dataset.dtype == np.uint16:
        return BFloat16Rows(dataset)
    if dtype == FLOAT8 and dataset.dtype == np.uint8:
        return Float8Rows(dataset, dataset.parent[str(dataset.attrs[Attr.SCALE])])
    return dataset


def stored_as(attrs) -> str | None:
    """How a dataset with ``attrs`` stores its rows where that is not float32, and what its
    fidelity attrs say that lost, in words; None for float32 rows as computed."""
    said = []
    dtype = str(attrs.get(Attr.DTYPE, "float32"))
    if dtype == FLOAT8:
        said.append("float8 (e4m3 bytes, a float32 scale per row)")
    elif dtype in ("float16", "bfloat16"):
        said.append(dtype)
    if Attr.COMPONENTS in attrs:
        said.append(f"{attrs.get(Attr.REDUCE)} on {int(attrs[Attr.COMPONENTS])} components")
    if not said:
        return None
    if int(attrs.get(Attr.FIDELITY_ROWS, 0)):
        said.append(fidelity_words(attrs))
    return "; ".join(said)


def fidelity_words(attrs) -> str:
    """A dataset's fidelity attrs (or a run's report of them) in words, for the log and the
    exports' notes."""
    variance = attrs.get("fidelity_explained_variance")
    kept = "" if variance is None else f"; pca keeps {100 * float(variance):.1f}% of the variance"
    return (f"against float32 over {int(attrs[Attr.FIDELITY_ROWS])} rows: relative error "
            f"{float(attrs['fidelity_mean_relative_error']):.3g} mean, "
            f"{float(attrs['fidelity_max_relative_error']):.3g} worst; cosine >= "
            f"{float(attrs['fidelity_min_cosine']):.6f}; CKA "
            f"{float(attrs['fidelity_cka']):.6f}{kept}")


class _Decoded:
    """A read-only dataset of float32 values made from stored bits: h5py's shape, chunks,
    attrs, ndim and slicing; ``dataset`` is the stored one."""

    def __init__(self, dataset: h5py.Dataset):
        self.dataset, self.name = dataset, dataset.name
        self.shape, self.chunks, self.attrs = dataset.shape, dataset.chunks, dataset.attrs
        self.ndim, self.dtype = dataset.ndim, np.dtype(np.float32)

    def __len__(self) -> int:
        return len(self.dataset)

    def read_direct(self, dest: np.ndarray, source_sel=None, dest_sel=None) -> None:
        """Read (decoded) into ``dest``, as h5py's ``read_direct``."""
        values = self[source_sel if source_sel is not None else ...]
        dest[dest_sel if dest_sel is not None else ...] = values

    def __array__(self, dtype=None, copy=None):
        values = self[...]
        return values if dtype is None else values.astype(dtype)


class BFloat16Rows(_Decoded):
    """A dataset stored as the raw bits of bfloat16 (HDF5 has no such type), read as float32:
    every bfloat16 value is a float32 value, so nothing is rounded."""

    def __getitem__(self, key) -> np.ndarray:
        bits = np.asarray(self.dataset[key], dtype=np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)

    def __repr__(self) -> str:
        return f"<bfloat16 rows read as float32 {self.shape} of {self.dataset.name}>"


class Float8Rows(_Decoded):
    """A dataset of e4m3 bytes and its scales, read as float32 (each value to within e4m3's
    rounding of what was captured: 3 mantissa bits, a relative step of 1/16 at most)."""

    def __init__(self, dataset: h5py.Dataset, scales: h5py.Dataset):
        super().__init__(dataset)
        self.scales = scales

    def __getitem__(self, key) -> np.ndarray:
        data = np.asarray(self.dataset[key])
        return decode_float8(data, self.scales[_leading(key, self.ndim, self.scales.ndim)])

    def __repr__(self) -> str:
        return f"<float8 rows read as float32 {self.shape} of {self.dataset.name}>"


def _leading(key, ndim: int, leading: int) -> tuple:
    """The part of an index into ``ndim`` axes that selects along the first ``leading``."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = next(n for n, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (ndim - len(key) + 1) + key[at + 1:]
    key = key + (slice(None),) * (ndim - len(key))
    return key[:leading]
