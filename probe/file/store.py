"""The HDF5 store: one growable, row-chunked dataset per "<layer>/<kind>", written batch by batch.

A run writes to ``<path>.partial`` and renames it to ``<path>`` only once it is complete, so a file
at the output path is always finished. Rows are made durable by ``commit`` (the ``num_committed``
attr is updated and the file flushed); a later run with the same config resumes after them. The
datasets are created when the store opens, from the shapes the run's dry run found; names and
attrs follow probe.file.format.

A run may also store rows per position, whose bounds datasets (DEFAULT_BOUNDS, or the one a
dataset's spec names: an encoder-decoder's decoder rows have their own) bound each sample's
rows, and a sample counts as committed once all its rows are.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import h5py
import numpy as np
import torch

from probe.errors import ConfigError
from probe.file.format import (
    DEFAULT_BOUNDS,
    INDEX,
    ROWS_PER_POSITION,
    SKIPPED,
    TARGET,
    Attr,
    DatasetSpec,
    bounds_of,
    creating_path,
    dataset_names,
    in_transform,
    partial_path,
)
from probe.file.partial import LIBVER, open_for_writing
from probe.file.transforms import write_transforms
from probe.version import __version__

__all__ = ["Store", "chunk_shape", "filter_options", "as_array", "close_after"]

log = logging.getLogger(__name__)

_CHUNK_BYTES = 2 << 20  # aim for about 2 MiB per chunk (h5py advises 10 KiB to a few MiB)
# A compressed chunk is written once, when full (see Store._write_rows), so its rows become
# durable together: few rows per chunk keep commits frequent. A power of two, so that chunks of
# different datasets all end where the largest ones do.
_COMPRESSED_CHUNK_ROWS = 32
_UNKNOWN_ROWS = 1 << 40  # the cap on a chunk's rows when a run's length is not known


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


def filter_options(compression: str, level: int | None = None) -> dict:
    """The ``create_dataset`` options of an HDF5 filter.

    Raises:
        ConfigError: an unknown filter, a level out of the filter's range or for a filter that
            takes none, or zstd without hdf5plugin.
    """
    compression = str(compression)
    if compression not in ("none", "lzf", "gzip", "zstd"):
        raise ConfigError(f"output.compression={compression!r}: use none, lzf, gzip or zstd")
    ranges = {"gzip": (0, 9), "zstd": (1, 22)}
    if level is not None and compression not in ranges:
        raise ConfigError(f"output.compression_level={level} but output.compression="
                          f"{compression} takes no level; set it to null, or use gzip or zstd")
    if level is not None and not ranges[compression][0] <= int(level) <= ranges[compression][1]:
        low, high = ranges[compression]
        raise ConfigError(f"output.compression_level={level} is out of range for {compression}: "
                          f"use {low} to {high}, or null for the default")
    if compression == "none":
        return {}
    if compression == "lzf":
        return {"compression": "lzf"}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4 if level is None else int(level)}
    try:
        import hdf5plugin
    except ImportError:
        raise ConfigError(
            "output.compression=zstd needs hdf5plugin: pip install 'probe[zstd]', or use lzf or "
            "gzip"
        ) from None
    return dict(hdf5plugin.Zstd(clevel=3 if level is None else int(level)))


class Store:
    """One run's HDF5 file, open for appending rows; a context manager that closes it.

    Example::

        specs = {"features.28/output": DatasetSpec((512, 14, 14), "float32")}
        with Store(path, config_yaml=yaml, num_rows=64, datasets=specs) as store:
            store.append(index, target, {"features.28/output": tensor})
            store.commit()
            store.finish()   # complete=True, renamed from <path>.partial to <path>

    Leaving the block without ``finish`` keeps the committed rows in ``<path>.partial`` for a
    later run to resume; a file this store created that holds no committed row is removed.
    """

    def __init__(self, path: Path, *, config_yaml: str, num_rows: int | None,
                 datasets: Mapping[str, DatasetSpec], has_target: bool = True,
                 per_position: bool = False, num_positions: int | None = None,
                 most_rows: int | None = None, most_positions: int | None = None,
                 resume_from: int = 0, resume_skipped: int = 0,
                 filters: Mapping | None = None, attrs: Mapping | None = None,
                 transforms: Mapping[str, Mapping] | None = None,
                 locking: bool | str | None = None):
        # num_rows and num_positions are None where the run cannot know them before it ends (a
        # dataset read as it comes): num_samples is then -1 until finish()
        self.path, self.num_rows, self.num_positions = Path(path), num_rows, num_positions
        self.per_position = per_position
        # the datasets that bound rows per position: the default one, and any a spec names
        self._bounds = {name: _Bounds() for name in
                        [*([DEFAULT_BOUNDS] if per_position else []),
                         *sorted({spec.bounds for spec in datasets.values()
                                  if spec.per_position and spec.bounds != DEFAULT_BOUNDS})]}
        # what a chunk is sized by where the counts are not known: a bound or an estimate (rows
        # a pass adds as it goes, a feed that counts them only as it reads); a small run makes
        # a small file
        self._most = (num_rows or most_rows, num_positions or most_positions)
        # HDF5 filter options (filter_options), applied to the layers' datasets
        self.filter = dict(filters or {})
        self.partial = partial_path(self.path)
        self.created = resume_from == resume_skipped == 0
        # Compressed chunks go through HDF5's chunk cache to be compressed (whole: see
        # _write_rows). Uncompressed chunks skip it (HDF5 writes a chunk larger than the cache
        # straight from the array), which saves a copy of every byte.
        cache = {"rdcc_nbytes": 8 * _CHUNK_BYTES if self.filter else 0}
        if self.created:
            # made in full under another name, then renamed: a partial file exists only once it
            # is consistent, whenever a kill comes
            self._create(config_yaml, has_target, datasets, attrs or {}, transforms or {},
                         locking)
        self._file = open_for_writing(self.partial, locking, **cache)
        self.num_committed = self.num_written = resume_from
        self.bytes_written = 0  # by this store, for the progress bar
        # compressed dataset -> (first row, rows) waiting for their chunk to fill
        self._pending: dict[str, tuple[int, np.ndarray]] = {}
        try:
            if not self.created:
                self._truncate(resume_from, resume_skipped)
            # each dataset of rows per position -> the dataset that bounds its rows
            self._per_position = {key: bounds_of(self._file[key].attrs)
                                  for key in _row_datasets(self._file)
                                  if self._file[key].attrs.get(Attr.ROWS) == ROWS_PER_POSITION}
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        close_after(self.close, exc_type is not None, str(self.partial))

    def _create(self, config_yaml: str, has_target: bool,
                datasets: Mapping[str, DatasetSpec], attrs: Mapping,
                transforms: Mapping[str, Mapping], locking: bool | str | None) -> None:
        creating = creating_path(self.path)
        try:
            with h5py.File(creating, "w", libver=LIBVER, locking=locking) as f:
                self._start(f, config_yaml, has_target, datasets, attrs)
                write_transforms(f, transforms)  # before any row: a resumed run reads them
            os.replace(creating, self.partial)
        except BaseException:
            creating.unlink(missing_ok=True)
            raise

    def _start(self, f: h5py.File, config_yaml: str, has_target: bool,
               datasets: Mapping[str, DatasetSpec], attrs: Mapping) -> None:
        fixed = {
            Attr.CONFIG: config_yaml,
            "probe_version": __version__,
            "torch_version": torch.__version__,
            "h5py_version": h5py.__version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            Attr.COMPLETE: False,
            Attr.NUM_SAMPLES: -1 if self.num_rows is None else self.num_rows,
            Attr.NUM_COMMITTED: 0,
            **({Attr.NUM_SKIPPED: 0} if SKIPPED in datasets else {}),
        }
        for key, value in {**fixed, **attrs}.items():
            f.attrs[key] = attr_value(value)
        per_sample = {Attr.DIMS: ["sample"]}
        bookkeeping = {INDEX: DatasetSpec((), "int64", per_sample, compressible=False)}
        if has_target:
            bookkeeping[TARGET] = DatasetSpec((), "int64", per_sample, compressible=False)
        for name, spec in {**bookkeeping, **datasets}.items():
            self._create_dataset(f, name, spec)
        for name in self._bounds:
            # N + 1 boundaries: sample i's rows lie between the i-th and the next
            bounds = self._create_dataset(f, name, DatasetSpec(
                (), "int64", {Attr.DIMS: ["boundary"]}, compressible=False))
            _append_rows(bounds, 0, 1, np.zeros(1, dtype=np.int64))

    def _create_dataset(self, f: h5py.File, name: str, spec: DatasetSpec) -> h5py.Dataset:
        dtype = np.dtype(spec.stored_dtype)
        options = self.filter if spec.compressible else {}
        if not options and dtype.kind != "O":  # variable-length strings HDF5 fills as it must
            # without a fill value to write first, HDF5 may write a new chunk directly (no cache);
            # every row is written before it is read, so the fill value would never be seen
            options = {"fill_time": "never"}
        rows = self._most[spec.per_position] or _UNKNOWN_ROWS
        dataset = f.create_dataset(
            name, shape=(0, *spec.row_shape), maxshape=(None, *spec.row_shape), dtype=dtype,
            chunks=chunk_shape(spec.row_shape, dtype.itemsize, max(1, rows),
                               compressed="compression" in options), **options)
        attrs = {**spec.attrs, **({Attr.ROWS: ROWS_PER_POSITION} if spec.per_position else {}),
                 **({Attr.OFFSETS: spec.bounds}
                    if spec.per_position and spec.bounds != DEFAULT_BOUNDS else {})}
        for key, value in attrs.items():
            dataset.attrs[key] = attr_value(value)
        return dataset

    def _truncate(self, rows: int, skipped: int) -> None:
        # rows past the last commit may be torn by the crash that ended the previous attempt
        for name, bounds in self._bounds.items():
            bounds.reset(self._file[name][: rows + 1])
        for name in _row_datasets(self._file):
            dataset = self._file[name]
            if name in self._bounds:
                dataset.resize(rows + 1, axis=0)
            elif name == SKIPPED:
                dataset.resize(skipped, axis=0)
            else:
                per_position = dataset.attrs.get(Attr.ROWS) == ROWS_PER_POSITION
                keep = self._bounds[bounds_of(dataset.attrs)].end if per_position else rows
                if h5py.check_vlen_dtype(dataset.dtype) is not None:
                    _clear_past(dataset, keep)
                dataset.resize(keep, axis=0)

    @property
    def positions_written(self) -> int:
        """The rows per position written so far (those of the default bounds)."""
        return self._bounds[DEFAULT_BOUNDS].end if DEFAULT_BOUNDS in self._bounds else 0

    @property
    def per_position_keys(self) -> dict[str, str]:
        """The datasets with one row per stored position, each with the dataset that bounds
        its rows."""
        return dict(self._per_position)

    def append(self, index: torch.Tensor, target: torch.Tensor | None,
               values: Mapping[str, torch.Tensor | np.ndarray],
               lengths: Mapping | torch.Tensor | np.ndarray | None = None, skipped=()) -> None:
        """Write one batch of rows after the ones already written; ``lengths`` (the position
        rows of each sample) for a run with rows per position: one array for the rows of the
        default bounds, or one per bounds dataset ({name: lengths}); ``skipped``, the dataset
        indices of samples left out of the batch (dataset.on_error=skip)."""
        start, stop = self.num_written, self.num_written + len(index)
        if self.num_rows is not None and stop > self.num_rows:
            raise ValueError(f"{stop} rows would exceed the run's {self.num_rows}")
        if lengths is not None and not isinstance(lengths, Mapping):
            lengths = {DEFAULT_BOUNDS: lengths}
        firsts = {name: bounds.end for name, bounds in self._bounds.items()}
        if len(index):
            for name, bounds in self._bounds.items():
                ends = bounds.end + np.cumsum(np.asarray(lengths[name], dtype=np.int64))
                _append_rows(self._file[name], start + 1, stop + 1, ends)
                bounds.extend(ends)
        for key, value in values.items():
            bounds = self._per_position.get(key)
            main = bounds == DEFAULT_BOUNDS  # the only rows per position counted beforehand
            first, total = ((firsts[bounds], self.num_positions if main else None)
                            if bounds is not None else (start, self.num_rows))
            array = as_array(value)
            self._write_rows(key, first, array, total)
            self.bytes_written += array.nbytes
        _append_rows(self._file[INDEX], start, stop, np.asarray(index))
        if TARGET in self._file:
            _append_rows(self._file[TARGET], start, stop, np.asarray(target))
        if len(skipped):
            found = self._file[SKIPPED]
            _append_rows(found, len(found), len(found) + len(skipped), np.asarray(skipped))
        self.num_written = stop

    def _write_rows(self, key: str, start: int, array: np.ndarray, total: int) -> None:
        dataset = self._file[key]
        if not dataset.id.get_create_plist().get_nfilters():
            # HDF5 writes just these rows' bytes; committed ones are not touched
            _append_rows(dataset, start, start + len(array), array)
            return
        # HDF5 compresses and writes a chunk whole. Written a second time (in place, or after
        # freeing its space), a crash midway could tear rows already committed in it. So rows
        # wait here until their chunk is full, or the run ends, and every chunk is written once.
        if key in self._pending:
            first, waiting = self._pending.pop(key)
            start, array = first, np.concatenate([waiting, array])
        stop = start + len(array)
        ready = stop if stop == total else stop - stop % dataset.chunks[0]
        if ready > start:
            _append_rows(dataset, start, ready, array[: ready - start])
        if ready < stop:
            self._pending[key] = (ready, array[ready - start:].copy())

    def commit(self) -> None:
        """Make the rows written so far durable (a resumed run continues after them), except
        compressed rows still waiting for their chunk to fill: a sample counts once all its
        rows are in the file."""
        durable = self.num_written
        for key, (first, _) in self._pending.items():
            if key in self._per_position:  # the samples whose rows all lie before `first`
                bounds = self._bounds[self._per_position[key]].values
                first = int(np.searchsorted(bounds, first, side="right")) - 1
            durable = min(durable, first)
        skipped = self._skipped_before(durable)
        # the rows and everything that leads to them first, then the counts that vouch for
        # them: a kill between the two flushes leaves the counts of the commit before
        self._file.flush()
        self._file.attrs.modify(Attr.NUM_COMMITTED, durable)
        if SKIPPED in self._file:
            self._file.attrs.modify(Attr.NUM_SKIPPED, skipped)
        self._file.flush()
        self.num_committed = durable

    def _skipped_before(self, durable: int) -> int:
        # the samples left out that lie before the first row not yet durable: with the durable
        # rows, they are the samples a resumed run has done
        if SKIPPED not in self._file:
            return 0
        skipped = self._file[SKIPPED]
        if durable == self.num_written:
            return len(skipped)
        return int(np.searchsorted(skipped[:], int(self._file[INDEX][durable])))

    def describe(self, attrs: Mapping[str, Mapping]) -> None:
        """Set attrs of datasets ({dataset: {name: value}}) that their specs made: what a run
        learned of its rows by their end (the fidelity of compact rows). A file open for SWMR
        writing can change an attr, never add one."""
        for key, values in attrs.items():
            for name, value in values.items():
                self._file[key].attrs.modify(name, attr_value(value))

    def finish(self) -> Path:
        """Mark the file complete and move it to its final path."""
        if self.num_rows is not None and self.num_written != self.num_rows:
            raise RuntimeError(f"finish() after {self.num_written} of {self.num_rows} rows")
        if self.num_positions is not None and self.positions_written != self.num_positions:
            raise RuntimeError(f"finish() after {self.positions_written} of "
                               f"{self.num_positions} position rows")
        for key, (first, waiting) in list(self._pending.items()):  # the last, short chunks
            _append_rows(self._file[key], first, first + len(waiting), waiting)
            del self._pending[key]
        self._check_lengths()
        self._file.attrs.modify(Attr.NUM_SAMPLES, self.num_written)
        self.commit()
        # complete only once every row is committed; a kill before the rename leaves a complete
        # partial file, which the next run only renames
        self._file.attrs.modify(Attr.COMPLETE, True)
        self._file.close()
        os.replace(self.partial, self.path)
        return self.path

    def _check_lengths(self) -> None:
        # our own invariant, before a file is called complete: every dataset holds a row per
        # sample (or per position), no fewer, no more
        for name in _row_datasets(self._file):
            if name in self._bounds or name == SKIPPED:
                continue
            want = (self._bounds[self._per_position[name]].end if name in self._per_position
                    else self.num_written)
            if len(self._file[name]) != want:
                raise RuntimeError(f"{name} holds {len(self._file[name])} rows, not {want}; "
                                   "the file is left unfinished")

    def close(self) -> None:
        """Close without finishing (nothing to do after ``finish``). A file this store created
        with nothing committed is removed, so a run that fails early leaves nothing behind."""
        if self._file.id.valid:
            self._file.close()
            if self.created and self.num_committed == 0:
                self.partial.unlink(missing_ok=True)


class _Bounds:
    """The bounds of the samples' rows per position written so far (one more than the
    samples), in a buffer that doubles when full: a copy per batch would cost the square of a
    run."""

    def __init__(self):
        self._buffer, self._count = np.zeros(1024, dtype=np.int64), 1

    @property
    def values(self) -> np.ndarray:
        return self._buffer[:self._count]

    @property
    def end(self) -> int:
        """Where the next sample's rows begin."""
        return int(self._buffer[self._count - 1])

    def reset(self, values: np.ndarray) -> None:
        self._count = 0
        self.extend(values)

    def extend(self, ends: np.ndarray) -> None:
        need = self._count + len(ends)
        if need > len(self._buffer):
            grown = np.zeros(max(need, 2 * len(self._buffer)), dtype=np.int64)
            grown[:self._count] = self.values
            self._buffer = grown
        self._buffer[self._count:need] = ends
        self._count = need


def close_after(close: Callable[[], None], failed: bool, what: str) -> None:
    """``close()`` at the end of a block; where the block failed, its own error (a full disk,
    say) is the one to report, and an error of closing is only logged."""
    if not failed:
        close()
        return
    try:
        close()
    except BaseException as err:
        log.debug("closing %s after an error failed too: %r", what, err)


def attr_value(value):
    """A value as an HDF5 attr that plain h5py reads back: lists of strings become variable-length
    string arrays, str subclasses (torch.__version__) plain str."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return np.array(value, dtype=h5py.string_dtype())
    return str(value) if isinstance(value, str) else value


def as_array(value: torch.Tensor | np.ndarray) -> np.ndarray:
    """A captured value as the numpy array the store writes (bfloat16 as its raw bits)."""
    if not isinstance(value, torch.Tensor):
        return np.asarray(value)
    if value.dtype == torch.bfloat16:  # stored as its raw bits: numpy has no bfloat16
        return value.view(torch.int16).numpy().view(np.uint16)
    return value.numpy()


def _row_datasets(f: h5py.File) -> list[str]:
    """The datasets that hold rows: all but the transforms of projected rows (written once)."""
    return [name for name in dataset_names(f) if not in_transform(name)]


def _clear_past(dataset: h5py.Dataset, rows: int) -> None:
    """Null every variable-length value that a chunk holds past row ``rows``.

    Writing a variable-length value frees the heap object of the value it replaces, read from
    the chunk. A kill after a chunk went to disk but before the dataset's extent or the heap
    did leaves, past the extent, references to heap objects that were never written (or that a
    later insert reuses): the resumed run's first write there would fail ("bad heap index") or
    free another row's string. Grown over every chunk stored and shrunk back, the extent makes
    HDF5 fill what lies past it with the fill value, the null reference."""
    ids = dataset.id
    end = max((ids.get_chunk_info(i).chunk_offset[0] + dataset.chunks[0]
               for i in range(ids.get_num_chunks())), default=0)
    if end > rows:
        dataset.resize(end, axis=0)
        dataset.resize(rows, axis=0)


def _append_rows(dataset: h5py.Dataset, start: int, stop: int, array: np.ndarray) -> None:
    if dataset.shape[0] < stop:
        dataset.resize(stop, axis=0)
    dataset[start:stop] = array
