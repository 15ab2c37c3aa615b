"""Reading a probe file back: ``probe.open(path)``.

Plain h5py reads every file this package writes; this reader adds the checks (a file that is not
complete is refused unless asked) and a few conveniences, among them ``f.loader(key)``: the rows
of one dataset in batches, streamed a few HDF5 chunks at a time (see probe.file.rows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
from omegaconf import DictConfig, OmegaConf

from probe.errors import ConfigError, DataError, OutputError
from probe.file.encodings import decoded, is_scale, stored_as
from probe.file.format import (
    INDEX,
    KINDS,
    OFFSETS,
    ROWS_PER_POSITION,
    TARGET,
    Attr,
    bounds_of,
    dataset_key,
    dataset_names,
    in_transform,
    partial_path,
    read_state,
    split_key,
)
from probe.file.output import WriterLock
from probe.file.partial import open_for_reading
from probe.file.transforms import inverse, read_transforms

if TYPE_CHECKING:
    import xarray

    from probe.file.rows import RowLoader

__all__ = ["open", "open_checked", "FeatureFile"]



def open(path: str | Path, *, allow_partial: bool = False) -> FeatureFile:  # noqa: A001
    """Open a finished probe file for reading (use it in a ``with`` block).

    Example::

        with probe.open("outputs/.../features.h5") as f:
            x = f["features.28/output"][:100]     # numpy, read lazily from disk
            y = f.target[:100]

    Args:
        path: the file a run wrote (or its ``.partial`` twin when ``allow_partial``).
        allow_partial: read the committed rows of a file whose run has not finished.

    Raises:
        DataError: no such file (a FileNotFoundError), or not a probe file.
        OutputError: the run that writes it has not finished (and not ``allow_partial``).
    """
    return FeatureFile(path, allow_partial=allow_partial)


def open_checked(path: str | Path) -> FeatureFile:
    """``open(path)`` for the analysis commands: every problem with the file is a ProbeError,
    and an unfinished file gets a message for someone who cannot pass ``allow_partial``.

    Raises:
        DataError: no such file, or not a probe file.
        OutputError: the run that writes it has not finished.
    """
    path = Path(path).expanduser()
    return FeatureFile(path, label="file=", fix="run the same probe command again to finish it")


class FeatureFile(Mapping):
    """A probe HDF5 file, read-only: a mapping from dataset names (``"index"``, ``"target"``,
    ``"<layer>/<kind>"``) to h5py datasets, plus the row index, targets and config.

    Example::

        with probe.open(path) as f:
            "index" in f, len(f), list(f)      # every dataset, as a mapping has them
            f.features                         # only the "<layer>/<kind>" ones
            x = f["layer4/output"][:64]        # h5py reads lazily
    """

    def __init__(self, path: str | Path, *, allow_partial: bool = False, label: str = "",
                 fix: str = "run the same command again to finish it, or pass "
                            "allow_partial=True to read the committed rows"):
        path = Path(path)
        if not path.exists() and partial_path(path).exists():
            if not allow_partial:
                writer = WriterLock(path).holder()
                going = (f"{writer} is writing it" if writer else
                         "its run was stopped before it finished")
                raise OutputError(f"{label}{str(path)!r} is not finished (only "
                                  f"{partial_path(path).name} is there): {going}; {fix}")
            path = partial_path(path)
        if not path.exists():  # a DataError is a FileNotFoundError too
            raise DataError(f"{label}{str(path)!r} does not exist; pass the .h5 file a probe "
                            "run wrote")
        self.path = path
        _register_extra_filters()
        try:
            self._file = open_for_reading(path)
            state = read_state(self._file, path)
        except (OSError, KeyError) as err:
            if hasattr(self, "_file"):
                self._file.close()
            reason = err.args[0] if isinstance(err, KeyError) and err.args else err
            raise DataError(f"{label}{str(path)!r} is not a probe file ({reason}); pass the .h5 "
                            "file a probe run wrote") from None
        self.complete = state.complete
        if not self.complete and not allow_partial:
            self._file.close()
            raise OutputError(f"{label}{str(path)!r} is not complete ({state.progress()}); {fix}")
        missing = _missing_sources(self._file, path)
        if missing:
            self._file.close()
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise DataError(
                f"{label}{str(path)!r} is a merged file whose rows live in shard files that are "
                f"not there: {missing[0]!r}{more}, looked for beside it in {str(path.parent)!r}; "
                "move the shard files along with it (keep the folder tree that merge made), or "
                "write a self-contained file with python -m probe.merge --copy -o OUT SHARD..."
            )
        self.num_rows = state.readable_rows
        self._sorted_index: tuple[np.ndarray, np.ndarray] | None = None

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[str]:
        return iter(dataset_names(self._file))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @property
    def features(self) -> list[str]:
        """Every stored "<layer>/<kind>", in file order (the mapping's keys less the index,
        targets and other bookkeeping: float8 rows' scales, the transforms of projected rows)."""
        return [dataset_key(layer, kind) for layer in self.layers for kind in self.kinds(layer)]

    @property
    def layers(self) -> list[str]:
        return [name for name, obj in self._file.items()
                if isinstance(obj, h5py.Group) and not in_transform(name)]

    def kinds(self, layer: str) -> list[str]:
        """The kinds stored for ``layer`` ("output", "grad_output", ...); [] for an unknown one."""
        group = self._file.get(layer)
        if not isinstance(group, h5py.Group) or in_transform(layer):
            return []
        return [kind for kind, dataset in group.items() if not is_scale(dataset)]

    def require(self, key: str) -> h5py.Dataset:
        """``self[key]``, or an error that says which run options would have stored it.

        Raises:
            ConfigError: the file does not hold ``key``.
        """
        if key in self.features:
            return self[key]
        layer, kind = split_key(key)
        hooks = [str(h) for h in self._file.attrs.get(Attr.HOOKS, [])]
        layers = [str(name) for name in self._file.attrs.get(Attr.LAYERS, self.layers)]
        if kind in KINDS and layer:
            wanted = {*hooks, KINDS[kind]}
            hooks = [hook for hook in KINDS.values() if hook in wanted]
            layers = list(dict.fromkeys([*layers, layer]))
            fix = (f"run probe with 'layers=[{','.join(layers)}]' 'hooks=[{','.join(hooks)}]' "
                   "to store it")
        else:
            fix = ("name it as <layer>/<kind>, where kind is output, input, grad_output or "
                   "grad_input")
        raise ConfigError(
            f"{key!r} is not in {str(self.path)!r}, which holds {self.features}; {fix}")

    def loader(self, key: str, batch_size: int = 256, shuffle: bool = False, seed: int = 0,
               rows: Sequence[int] | np.ndarray | None = None) -> RowLoader:
        """Batches ``(x, y)`` of the rows of ``key``, read a few whole chunks at a time.

        Example::

            for x, y in f.loader("layer4/output", batch_size=256, shuffle=True, rows=train):
                ...     # x: (B, *row shape) tensor as stored; y: (B,) int64, or None

        Args:
            key: "<layer>/<kind>".
            batch_size: rows per batch (the last batch may hold fewer).
            shuffle: permute the order of chunk-aligned blocks, then the rows within a buffer
                of blocks (256 MiB), anew on every pass; the order is fixed by ``seed``.
            seed: seeds the shuffle.
            rows: the row numbers to yield (any order; each once), or None for all rows.

        Raises:
            KeyError: the file does not hold ``key``.
            IndexError: a row number is out of range.
        """
        from probe.file.rows import RowLoader, TokenTargets

        target = self.target
        if self.per_token(key):  # a token row's target is its sample's
            num_rows = int(self.offsets[-1])
            target = None if target is None else TokenTargets(target, self.offsets)
        else:
            num_rows = self.num_rows
        return RowLoader(self[key], target, num_rows=num_rows, batch_size=batch_size,
                         shuffle=shuffle, seed=seed, rows=rows)

    def __getitem__(self, key: str):
        """The h5py dataset (lazy: slice it to read); of a partial file, only the first
        ``num_rows`` rows (their token rows, for rows per token) are committed. A dataset
        stored as bfloat16 reads as float32, exactly; one stored as float8 reads as float32
        decoded by its scales (probe.file.encodings)."""
        if key not in self._file or not isinstance(self._file[key], h5py.Dataset):
            raise KeyError(f"{key!r} is not in {self.path}; it holds {list(self)}")
        return decoded(self._file[key])

    def stored_as(self, key: str) -> str | None:
        """How ``key``'s rows are stored where it is not as float32 (float16, bfloat16, float8,
        projected), with what that lost (its fidelity attrs), in words; None for float32."""
        return stored_as(self[key].attrs)

    def transform(self, key: str) -> dict | None:
        """The projection of reduce=pca|srp rows ``key``: {"mean" (D,), "components" (K, D),
        "explained_variance" (K,) or None, "attrs"} (probe.file.transforms); None for rows
        that were not projected."""
        self.require(key)
        return read_transforms(self._file).get(key)

    def inverse(self, key: str, rows) -> np.ndarray:
        """Projected rows (n, K) of ``key`` mapped back to the rows' space (n, D): pca's
        reconstruction from its components, a random projection's least-squares estimate.

        Raises:
            ConfigError: ``key``'s rows were not projected.
        """
        transform = self.transform(key)
        if transform is None:
            raise ConfigError(f"{key!r} in {str(self.path)!r} holds rows as computed, not "
                              "projected (reduce=pca|srp): there is nothing to invert")
        return inverse(transform, np.asarray(rows))

    def to_xarray(self, key: str) -> xarray.DataArray:
        """``key`` as a lazy ``xarray.DataArray`` (probe.file.dataarray): the file's dims,
        coords along the rows (index, target, ...; sample, input_ids, ... for token rows);
        nothing is read until indexed. Use it while the file is open, or ``.load()`` it.

        Example::

            x = f.to_xarray("transformer.h.6/output")      # dims ('token', 'feature')
            x.where(x.document == 3, drop=True).values

        Raises:
            ConfigError: the file does not hold ``key``.
            ImportError: xarray is not installed (pip install 'probe[export]').
        """
        if key not in self._file or not isinstance(self._file[key], h5py.Dataset):
            self.require(key)
        try:
            from probe.file.dataarray import data_array
        except ImportError as err:
            if err.name != "xarray":
                raise
            raise ImportError("to_xarray needs xarray: pip install 'probe[export]'") from None
        return data_array(self, key)

    def per_token(self, key: str) -> bool:
        """Whether ``key`` holds one row per stored token (else one per sample)."""
        return self[key].attrs.get(Attr.ROWS) == ROWS_PER_POSITION

    @property
    def offsets(self) -> np.ndarray | None:
        """For rows per token: sample i's rows are ``offsets[i]:offsets[i+1]`` (None else)."""
        return self._file[OFFSETS][: self.num_rows + 1] if OFFSETS in self._file else None

    def offsets_of(self, key: str) -> np.ndarray:
        """The bounds of ``key``'s rows per token: sample i's are ``[i]:[i+1]`` of it
        (/offsets, or an encoder-decoder's /decoder_offsets for its decoder's rows)."""
        return self._file[bounds_of(self[key].attrs)][: self.num_rows + 1]

    def rows_of(self, key: str, index: int | None = None, *, row: int | None = None
                ) -> np.ndarray:
        """The rows of dataset sample ``index`` (as ``/index`` names it, wherever its row lies:
        a shard, a subset, a merged file), or of the file's ``row``-th row: its token rows for
        a dataset with rows per token, else its one row.

        Raises:
            KeyError: the file holds no row of that dataset index.
            IndexError: ``row`` is out of range.
        """
        if (index is None) == (row is None):
            raise TypeError("rows_of takes a dataset index, or row=<the row's position>")
        if row is None:
            row = self._row_of(int(index))
        elif not 0 <= row < self.num_rows:
            raise IndexError(f"row {row} is out of range: the file has {self.num_rows}")
        if self.per_token(key):
            start, stop = self._file[bounds_of(self[key].attrs)][row:row + 2]
            return self[key][int(start):int(stop)]
        return self[key][row]

    def _row_of(self, index: int) -> int:
        # by a sorted copy of /index, made once: merged text files are in shard order
        if self._sorted_index is None:
            order = np.argsort(self.index, kind="stable")
            self._sorted_index = (self.index[order], order)
        values, order = self._sorted_index
        at = int(np.searchsorted(values, index))
        if at == len(values) or values[at] != index:
            raise KeyError(f"dataset index {index} is not in {str(self.path)!r}, which holds "
                           f"{self.num_rows} samples (of a shard, limit or subset); its /index "
                           "says which")
        return int(order[at])

    @property
    def index(self) -> np.ndarray:
        return self._file[INDEX][: self.num_rows]

    @property
    def target(self) -> np.ndarray | None:
        return self._file[TARGET][: self.num_rows] if TARGET in self._file else None

    @property
    def attrs(self) -> dict:
        return dict(self._file.attrs)

    @property
    def config(self) -> DictConfig:
        """The resolved config of the run that wrote the file."""
        return OmegaConf.create(str(self._file.attrs[Attr.CONFIG]))

    def __repr__(self) -> str:
        state = "complete" if self.complete else "partial"
        rows = f"{self.num_rows} rows"
        if self.offsets is not None:  # rows per position: a row of /index is a sample
            rows = f"{self.num_rows} samples, {int(self.offsets[-1])} position rows"
        return f"FeatureFile({str(self.path)!r}, {rows}, {state}, {self.features})"


def _missing_sources(f: h5py.File, path: Path) -> list[str]:
    """The source files of the file's virtual datasets (a merged file's shards) that are not
    where HDF5 looks for them: beside the file, for the relative paths merge writes."""
    missing: dict[str, None] = {}
    for dataset in map(f.__getitem__, dataset_names(f)):
        if dataset.is_virtual:
            for source in dataset.virtual_sources():
                name = source.file_name
                if name != "." and not (path.parent / name).is_file():
                    missing[name] = None
    return list(missing)


def _register_extra_filters() -> None:
    # files written with output.compression=zstd need hdf5plugin's filters to be read
    with contextlib.suppress(ImportError):
        import hdf5plugin  # noqa: F401
