"""The HDF5 store: one growable, row-chunked dataset per "<layer>/<kind>", written batch by batch.

A run writes to ``<path>.partial`` and renames it to ``<path>`` only once it is complete, so a file
at the output path is always finished. Rows are made durable by ``commit`` (the ``num_committed``
attr is updated and the file flushed); a later run with the same config resumes after them.

Layout (see DESIGN.md)::

    /                 attrs: config, probe_version, torch_version, created, complete, num_samples
    /index (N,)       int64 dataset index of each row
    /target (N,)      int64 the dataset's target, where it has one
    /<layer>/<kind>   (N, *S) attrs: layer, hook, kind, reduce, dtype
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import h5py
import numpy as np
import torch
import yaml

from probe.errors import ConfigError, OutputError

__all__ = ["Store", "partial_path", "check_output", "check_free_space", "file_locking",
           "IGNORED_KEYS"]

log = logging.getLogger(__name__)

# Keys that do not change what is stored: they may differ between a run and its resumption.
IGNORED_KEYS = ("batch_size", "num_workers", "device", "stop_early", "output.path",
                "output.overwrite", "output.commit_every", "output.commit_seconds",
                "output.check_free_space", "output.file_locking")
_CHUNK_BYTES = 2 << 20  # aim for about 2 MiB per chunk (h5py advises 10 KiB to a few MiB)
# A compressed chunk is written once, when full (see Store._write_rows), so its rows become
# durable together: few rows per chunk keep commits frequent. A power of two, so that chunks of
# different datasets all end where the largest ones do.
_COMPRESSED_CHUNK_ROWS = 32


def partial_path(path: Path) -> Path:
    """Where a run keeps its file until it is complete."""
    return path.with_name(path.name + ".partial")


def file_locking(value) -> bool | str | None:
    """The ``locking`` argument of ``h5py.File`` for the config's ``output.file_locking``.

    Raises:
        ConfigError: a value other than null, true, false or best-effort.
    """
    if value is None or isinstance(value, bool) or value == "best-effort":
        return value
    raise ConfigError(
        f"output.file_locking={value!r}: use null, true, false or best-effort"
    )


def check_output(path: Path, config_yaml: str, overwrite: bool,
                 locking: bool | str | None = None) -> int | None:
    """Decide what a run with this config does at ``path``, before any compute.

    Returns:
        None when ``path`` already holds the finished file of this config (nothing to do);
        otherwise the number of committed rows to resume after (0 to start afresh).

    Raises:
        OutputError: the directory cannot be written, or a file there belongs to another config
            (unless ``overwrite``).
    """
    _check_writable(path.parent)
    partial = partial_path(path)
    if overwrite:
        partial.unlink(missing_ok=True)
        return 0
    if path.exists():
        _require_same_config(path, config_yaml, finished=True, locking=locking)
        return None
    if partial.exists():
        committed = _require_same_config(partial, config_yaml, finished=False, locking=locking)
        if committed:
            log.info("resuming %s after %d committed rows", partial, committed)
        return committed
    return 0


def check_free_space(directory: Path, needed: int) -> None:
    """Refuse a run whose estimated size does not fit on the disk that holds ``directory``.

    Raises:
        OutputError: with both numbers, and how to skip the check.
    """
    free = shutil.disk_usage(directory).free
    log.info("estimated size %.1f MiB; %.1f MiB free in %s", needed / 2**20, free / 2**20,
             directory)
    if needed > free:
        raise OutputError(
            f"the run needs about {needed / 2**30:.2f} GiB but {str(directory)!r} has "
            f"{free / 2**30:.2f} GiB free; free space, choose another output.path, use "
            "reduce=mean or output.dtype=float16, or set output.check_free_space=false"
        )


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe_file = directory / f".probe-write-test-{os.getpid()}"
        probe_file.touch()
        probe_file.unlink()
    except OSError as err:
        raise OutputError(
            f"cannot write to the output directory {str(directory)!r} ({err.strerror or err}); "
            "choose a writable output.path"
        ) from None


def _require_same_config(path: Path, config_yaml: str, *, finished: bool,
                         locking: bool | str | None) -> int:
    try:
        with h5py.File(path, "r", locking=locking) as f:
            stored = str(f.attrs["config"])
            complete = bool(f.attrs.get("complete", False))
            committed = int(f.attrs.get("num_committed", 0))
    except (OSError, KeyError) as err:
        raise OutputError(
            f"{str(path)!r} exists but is not a readable probe file ({err}); choose another "
            "output.path or set output.overwrite=true to replace it"
        ) from None
    differing = differing_keys(yaml.safe_load(stored), yaml.safe_load(config_yaml))
    if differing:
        raise OutputError(
            f"{str(path)!r} holds a run of another config (differs in: {', '.join(differing)}); "
            "choose another output.path or set output.overwrite=true to replace it"
        )
    if finished and not complete:
        raise OutputError(
            f"{str(path)!r} exists but is not complete; set output.overwrite=true to start again"
        )
    return committed


def differing_keys(a: Mapping, b: Mapping) -> list[str]:
    """Dotted keys whose values differ between two configs, ignoring ``IGNORED_KEYS``."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return [k for k in keys if k not in IGNORED_KEYS and flat_a.get(k) != flat_b.get(k)]


def _flatten(node: Mapping, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def chunk_shape(row_shape: tuple[int, ...], itemsize: int, max_rows: int, *,
                compressed: bool = False) -> tuple[int, ...]:
    """Chunks of about 2 MiB along the row axis; a row larger than that is split along its own
    leading axes, and a chunk never holds more rows than the run writes. Compressed chunks hold
    a power of two rows, at most ``_COMPRESSED_CHUNK_ROWS``."""
    row_bytes = itemsize * math.prod(row_shape)
    if row_bytes <= _CHUNK_BYTES:
        rows = max(1, min(max_rows, _CHUNK_BYTES // max(row_bytes, 1)))
        if compressed:
            rows = 1 << (min(rows, _COMPRESSED_CHUNK_ROWS).bit_length() - 1)
        return (rows, *row_shape)
    shape = list(row_shape)
    for axis in range(len(shape)):
        while itemsize * math.prod(shape) > _CHUNK_BYTES and shape[axis] > 1:
            shape[axis] = math.ceil(shape[axis] / 2)
    return (1, *shape)


class Store:
    """One run's HDF5 file, open for appending rows.

    Example::

        store = Store(path, config_yaml=text, num_rows=64, has_target=True)
        store.append(index, target, {"features.28/output": tensor})
        store.commit()
        store.finish()     # complete=True, renamed from <path>.partial to <path>
    """

    def __init__(self, path: Path, *, config_yaml: str, num_rows: int, has_target: bool,
                 resume_from: int = 0, dtype: str = "float32", compression: str = "none",
                 compression_level: int | None = None, attrs: Mapping | None = None,
                 locking: bool | str | None = None):
        self.path, self.num_rows = Path(path), num_rows
        self.dtype = np.dtype(dtype)
        self.filter = _filter_options(compression, compression_level)
        self.partial = partial_path(self.path)
        self.created = resume_from == 0
        # Compressed chunks go through HDF5's chunk cache to be compressed (whole: see
        # _write_rows). Uncompressed chunks skip it (HDF5 writes a chunk larger than the cache
        # straight from the array), which saves a copy of every byte.
        cache = 8 * _CHUNK_BYTES if self.filter else 0
        self._file = h5py.File(self.partial, "w" if self.created else "r+", locking=locking,
                               rdcc_nbytes=cache, rdcc_w0=1.0)
        self.num_committed = self.num_written = resume_from
        # compressed dataset -> (first row, rows) waiting for their chunk to fill
        self._pending: dict[str, tuple[int, np.ndarray]] = {}
        try:
            if self.created:
                self._start(config_yaml, has_target, attrs or {})
            else:
                self._truncate(resume_from)
        except BaseException:
            self.close(discard_if_empty=True)
            raise

    def _start(self, config_yaml: str, has_target: bool, attrs: Mapping) -> None:
        import torchvision

        from probe import __version__

        f = self._file
        fixed = {
            "config": config_yaml,
            "probe_version": __version__,
            "torch_version": torch.__version__,
            "torchvision_version": torchvision.__version__,
            "h5py_version": h5py.__version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "complete": False,
            "num_samples": self.num_rows,
            "num_committed": 0,
        }
        for key, value in {**fixed, **attrs}.items():
            f.attrs[key] = _attr_value(value)
        self._growable("index", (), np.int64)
        if has_target:
            self._growable("target", (), np.int64)

    def _truncate(self, rows: int) -> None:
        # rows past the last commit may be torn by the crash that ended the previous attempt
        for dataset in self._datasets():
            dataset.resize(rows, axis=0)

    def _datasets(self) -> list[h5py.Dataset]:
        found: list[h5py.Dataset] = []
        self._file.visititems(lambda _, obj: found.append(obj) if isinstance(obj, h5py.Dataset)
                              else None)
        return found

    def _growable(self, name: str, row_shape: tuple[int, ...], dtype, **options) -> h5py.Dataset:
        dtype = np.dtype(dtype)
        compressed = bool(options)  # the options are a compression filter's
        if not compressed:
            # without a fill value to write first, HDF5 may write a new chunk directly (no cache);
            # every row is written before it is read, so the fill value would never be seen
            options = {"fill_time": "never"}
        return self._file.create_dataset(
            name, shape=(0, *row_shape), maxshape=(None, *row_shape), dtype=dtype,
            chunks=chunk_shape(row_shape, dtype.itemsize, self.num_rows, compressed=compressed),
            **options)

    def append(self, index: torch.Tensor, target: torch.Tensor,
               values: Mapping[str, torch.Tensor],
               attrs_for: Callable[[str], Mapping] | None = None) -> None:
        """Write one batch of rows after the ones already written; ``attrs_for(key)`` gives
        the attrs of a dataset when its first batch creates it."""
        start, stop = self.num_written, self.num_written + len(index)
        if stop > self.num_rows:
            raise ValueError(f"{stop} rows would exceed the run's {self.num_rows}")
        f = self._file
        for key, value in values.items():
            array = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if key not in f:
                dataset = self._growable(key, array.shape[1:], self.dtype, **self.filter)
                dataset.attrs.update(attrs_for(key) if attrs_for else {})
            self._write_rows(key, start, array)
        _append_rows(f["index"], start, stop, index.numpy())
        if "target" in f:
            _append_rows(f["target"], start, stop, target.numpy())
        self.num_written = stop

    def _write_rows(self, key: str, start: int, array: np.ndarray) -> None:
        dataset = self._file[key]
        if not self.filter:  # HDF5 writes just these rows' bytes; committed ones are not touched
            _append_rows(dataset, start, start + len(array), array)
            return
        # HDF5 compresses and writes a chunk whole. Written a second time (in place, or after
        # freeing its space), a crash midway could tear rows already committed in it. So rows
        # wait here until their chunk is full, or the run ends, and every chunk is written once.
        if key in self._pending:
            first, waiting = self._pending.pop(key)
            start, array = first, np.concatenate([waiting, array])
        stop = start + len(array)
        ready = stop if stop == self.num_rows else stop - stop % dataset.chunks[0]
        if ready > start:
            _append_rows(dataset, start, ready, array[: ready - start])
        if ready < stop:
            self._pending[key] = (ready, array[ready - start:].copy())

    def commit(self) -> None:
        """Make the rows written so far durable (a resumed run continues after them), except
        compressed rows still waiting for their chunk to fill."""
        durable = min((first for first, _ in self._pending.values()), default=self.num_written)
        self._file.attrs["num_committed"] = durable
        self._file.flush()
        self.num_committed = durable

    def finish(self) -> Path:
        """Mark the file complete and move it to its final path."""
        if self.num_written != self.num_rows:
            raise RuntimeError(f"finish() after {self.num_written} of {self.num_rows} rows")
        self._file.attrs["complete"] = True
        self.commit()
        self._file.close()
        os.replace(self.partial, self.path)
        return self.path

    def close(self, *, discard_if_empty: bool = False) -> None:
        """Close without finishing; a file this attempt created with nothing committed is
        removed when ``discard_if_empty``, so a run that fails early leaves nothing behind."""
        if self._file.id.valid:
            self._file.close()
        if discard_if_empty and self.created and self.num_committed == 0:
            self.partial.unlink(missing_ok=True)


def _attr_value(value):
    # lists of text become HDF5 variable-length string arrays, which plain h5py reads back
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return np.array(value, dtype=h5py.string_dtype())
    return str(value) if isinstance(value, str) else value  # str subclasses (torch.__version__)


def _append_rows(dataset: h5py.Dataset, start: int, stop: int, array: np.ndarray) -> None:
    if dataset.shape[0] < stop:
        dataset.resize(stop, axis=0)
    dataset[start:stop] = array


def _filter_options(compression: str, level: int | None) -> dict:
    compression = str(compression)
    if compression == "none":
        return {}
    if compression == "lzf":
        return {"compression": "lzf"}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4 if level is None else int(level)}
    if compression == "zstd":
        try:
            import hdf5plugin
        except ImportError:
            raise ConfigError(
                "output.compression=zstd needs hdf5plugin: pip install 'probe[zstd]', or use "
                "lzf or gzip"
            ) from None
        return dict(hdf5plugin.Zstd(clevel=3 if level is None else int(level)))
    raise ConfigError(f"output.compression={compression!r}: use none, lzf, gzip or zstd")
