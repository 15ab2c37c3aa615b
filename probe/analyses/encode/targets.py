"""The targets of an encoding model: a ``.npy`` array (N, V) or an HDF5 dataset
(``path.h5:name``), row i belonging to dataset sample i, read without loading it whole."""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np

from probe.analyses.stats import read_rows
from probe.errors import ConfigError, DataError
from probe.file.encodings import decoded
from probe.file.format import Attr
from probe.file.read import FeatureFile

__all__ = ["Targets", "open_targets"]

_H5_SUFFIXES = (".h5", ".hdf5", ".hdf")


class Targets:
    """The targets as (N, V) rows, read a selection at a time; close it when done.

    Example::

        with open_targets("bold.npy") as targets:
            y = targets.rows(np.array([3, 0, 7]))    # (3, V) float64
    """

    def __init__(self, spec: str, array, handle: h5py.File | None = None,
                 option: str = "targets"):
        self.spec, self.array, self.handle, self.option = spec, array, handle, option
        self.num_rows = int(array.shape[0])
        self.num_columns = int(math.prod(array.shape[1:]))

    def __enter__(self) -> Targets:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()

    def rows(self, samples: np.ndarray) -> np.ndarray:
        """The rows of these dataset samples, (len(samples), V) float64.

        Raises:
            DataError: a row holds NaN or an infinity.
        """
        values = read_rows(self.array, samples).astype(np.float64)  # a copy, never the map
        values = values.reshape(len(samples), self.num_columns)
        if not np.isfinite(values).all():
            bad = int(samples[np.flatnonzero(~np.isfinite(values).all(1))[0]])
            raise DataError(f"{self.option}={self.spec!r} holds NaN or an infinity in row {bad}; "
                            "drop or fill those values first")
        return values

    def check_rows_of(self, f: FeatureFile) -> None:
        """Check that these targets have a row for every sample of the run's dataset.

        Raises:
            ConfigError: they have another number of rows than the dataset has samples (or,
                where the file does not say how many it has, fewer than its samples need).
        """
        length = _dataset_length(f)
        if length is not None and self.num_rows != length:
            raise ConfigError(
                f"{self.option}={self.spec!r} has {self.num_rows} rows, but the dataset of "
                f"{str(f.path)!r} has {length} samples; row i of the targets belongs to "
                "dataset sample i, so they need one row per sample")
        highest = int(f.index.max()) if f.num_rows else -1
        if self.num_rows <= highest:
            raise ConfigError(
                f"{self.option}={self.spec!r} has {self.num_rows} rows, but {str(f.path)!r} holds "
                f"dataset sample {highest}; row i of the targets belongs to dataset sample i, "
                f"so they need at least {highest + 1} rows")


def open_targets(spec: str | Path, option: str = "targets") -> Targets:
    """Open ``T.npy`` (memory-mapped) or ``T.h5:name``, given as ``option`` (what the errors
    name: the targets, or the onsets and repeats that come as arrays too).

    Raises:
        ConfigError: not one of those forms, or no such dataset in the HDF5 file, or not
            numbers.
        DataError: no such file.
    """
    spec = str(spec)
    path, _, name = spec.rpartition(":")
    if path.lower().endswith(_H5_SUFFIXES) and name:
        return _from_hdf5(spec, Path(path).expanduser(), name, option)
    path = Path(spec).expanduser()
    if path.suffix.lower() in _H5_SUFFIXES:
        raise ConfigError(f"{option}={spec!r} is an HDF5 file; name its dataset as "
                          f"{option}={spec}:NAME")
    if path.suffix.lower() != ".npy":
        raise ConfigError(f"{option}={spec!r}: use a .npy file (N, V) or an HDF5 dataset as "
                          "path.h5:name")
    if not path.is_file():
        raise DataError(f"{option}={spec!r} does not exist; pass a .npy file of (N, V) rows")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise ConfigError(f"{option}={spec!r} cannot be read as a numeric array ({err})") from None
    return _checked(spec, array, option=option)


def _from_hdf5(spec: str, path: Path, name: str, option: str) -> Targets:
    if not path.is_file():
        raise DataError(f"{option}={spec!r}: {str(path)!r} does not exist")
    try:
        handle = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{option}={spec!r}: {str(path)!r} is not an HDF5 file ({err})") from None
    dataset = handle.get(name)
    if not isinstance(dataset, h5py.Dataset):
        names: list[str] = []
        handle.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset)
                          else None)
        handle.close()
        raise ConfigError(f"{option}={spec!r}: {str(path)!r} has no dataset {name!r}; it holds "
                          f"{names}")
    try:
        # a probe file's bfloat16 or float8 rows, as floats
        return _checked(spec, decoded(dataset), handle, option)
    except BaseException:
        handle.close()
        raise


def _checked(spec: str, array, handle: h5py.File | None = None,
             option: str = "targets") -> Targets:
    if array.ndim < 1 or array.shape[0] == 0:
        raise ConfigError(f"{option}={spec!r} holds no rows (shape {tuple(array.shape)})")
    if not (np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)):
        raise ConfigError(f"{option}={spec!r} holds {array.dtype}, not numbers")
    if math.prod(array.shape[1:]) == 0:
        raise ConfigError(f"{option}={spec!r} has no columns (shape {tuple(array.shape)}); "
                          "pass (N, V) values with V >= 1")
    return Targets(spec, array, handle, option)


def _dataset_length(f: FeatureFile) -> int | None:
    # the data fingerprint records the dataset's length (a stream has none)
    text = f.attrs.get(Attr.DATA_FINGERPRINT)
    if text is None:
        return None
    try:
        length = json.loads(str(text)).get("length")
    except (ValueError, AttributeError):
        return None
    return int(length) if isinstance(length, int) and length > 0 else None
