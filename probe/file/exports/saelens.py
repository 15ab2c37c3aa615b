"""``to=saelens``: a Hugging Face ``datasets`` folder of fixed-length contexts, as SAELens'
activation cache is (``CacheActivationsRunner`` writes it, ``ActivationsStore`` reads it with
``cached_activations_path=``), from a packed text run (``dataset.packing=true``).

A row per window of the run (``dataset.max_length`` tokens, a context):

    <layer>      Array2D (context, d): the window's rows of that layer's key, named by the layer
                 (or ``names={layer: hook name}``); a layer of several kinds: ``<layer>/<kind>``
    token_ids    the window's token ids, a list of ``context`` int32 (SAELens' own column)
    index        the window's row in the file (its /index row; the file's /index[index] is the
                 dataset index of the window)

the types SAELens' cache runner declares (``Array2D(shape=(context, d_in), dtype)`` and
``Sequence(Value("int32"), length=context)``), in the files ``save_to_disk`` writes
(``data-00000-of-0000N.arrow``, ``state.json``, ``dataset_info.json``), so that
``datasets.load_from_disk`` opens it. bfloat16 rows are float32 (exactly).

The rows are shuffled on disk, not through an indices mapping (a ``Dataset.shuffle`` that is
then saved is not shuffled on disk): row j of the folder holds window ``order[j]``, ``order``
a seeded permutation of the windows (``numpy.random.default_rng(seed).permutation``, so the
``index`` column can be checked against it). It is applied in buffered passes: each pass
gathers the next rows of the output, as many as half the memory budget holds, reads their
windows from the HDF5 file in file order (a run of neighbouring windows at once), and appends
them to the arrow file; the whole file is never in memory. A last window shorter than the
others is left out, and the log says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import numpy as np

from probe.errors import ConfigError
from probe.file.exports.stream import Source
from probe.file.format import INPUT_IDS, split_key

__all__ = ["SaelensExport", "cache_features"]

log = logging.getLogger(__name__)

_SHARD_BYTES = 500 << 20  # datasets' own default max_shard_size for save_to_disk


class SaelensExport:
    """The windows of a packed text run as a shuffled SAELens activation cache.

    Raises:
        ConfigError: the run was not packed, a key without a row per token or with more than a
            vector a row, windows of uneven length (dataset.exclude_special=true), ``names``
            that name no exported layer, or two columns of one name.
    """

    def __init__(self, source: Source, *, seed: int | None, names: dict[str, str],
                 chosen: bool):
        attrs = source.file.attrs
        if not bool(attrs.get("packing", False)):
            what = ("dataset.packing=false" if "packing" in attrs else "not a text run")
            raise ConfigError(
                f"to=saelens needs a packed text run (dataset.packing=true), and "
                f"{str(source.path)!r} is {what}; run probe with dataset=text "
                "dataset.packing=true dataset.max_length=<context>, or export it to=npy")
        self.source, self.seed = source, seed
        self.context = int(attrs["max_length"])
        self.keys = _token_keys(source, chosen)
        self.columns = _column_names(self.keys, names)
        self.windows, self.notes = self._full_windows()

    def _full_windows(self) -> tuple[np.ndarray, list[str]]:
        offsets = self.source.offsets()
        lengths = np.diff(offsets)
        short = np.flatnonzero(lengths != self.context)
        if len(short) > 1 or (len(short) and lengths[short[0]] > self.context):
            why = (" (dataset.exclude_special=true left special tokens out of the rows; run "
                   "with exclude_special=false)" if self.source.file.attrs.get("exclude_special")
                   else "")
            raise ConfigError(
                f"to=saelens needs windows of dataset.max_length={self.context} rows, and "
                f"{len(short)} of {len(lengths)} windows of {self.source.path.name} have another "
                f"length{why}")
        if len(short) == len(lengths):
            raise ConfigError(f"to=saelens found no window of dataset.max_length={self.context} "
                              f"tokens in {self.source.path.name}: its corpus is shorter; run "
                              "with a smaller dataset.max_length")
        notes = [f"left out window {int(w)} (its row of /index), the last of the corpus: "
                 f"{int(lengths[w])} of {self.context} tokens" for w in short]
        for note in notes:
            log.warning(note)
        return np.flatnonzero(lengths == self.context), notes

    def order(self) -> np.ndarray:
        """The window (its row of /index) of each row of the folder, in the folder's order."""
        if self.seed is None:
            return self.windows
        return self.windows[np.random.default_rng(self.seed).permutation(len(self.windows))]

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int | None]]:
        import pyarrow as pa
        from datasets.arrow_writer import ArrowWriter

        features = cache_features({self.columns[k]: self.source[k].shape[1] for k in self.keys},
                                  self.context, {self.columns[k]: _dtype(self.source, k)
                                                 for k in self.keys})
        order, offsets = self.order(), self.source.offsets()
        window_bytes = self.context * (4 + sum(_dtype(self.source, k).itemsize
                                               * self.source[k].shape[1] for k in self.keys))
        per_pass = max(1, budget // 2 // window_bytes)  # half: a read run sits beside the buffer
        per_shard = max(per_pass, _SHARD_BYTES // window_bytes // per_pass * per_pass)
        count = max(1, -(-len(order) // per_shard))
        written = []
        for shard in range(count):
            name = Path(f"data-{shard:05d}-of-{count:05d}.arrow")
            # a native file: ArrowWriter's own path= goes through a Python file object
            writer = ArrowWriter(features=features, stream=pa.OSFile(str(folder / name), "wb"))
            rows = order[shard * per_shard:(shard + 1) * per_shard]
            for start in range(0, len(rows), per_pass):
                writer.write_table(self._table(features, rows[start:start + per_pass], offsets))
            if not len(rows):
                writer.write_table(self._table(features, rows, offsets))
            writer.finalize()
            written.append((name, len(rows)))
        self._write_state(folder, features, [str(p) for p, _ in written])
        return [*written, (Path("state.json"), None), (Path("dataset_info.json"), None)]

    def _table(self, features, windows: np.ndarray, offsets: np.ndarray):
        import pyarrow as pa

        columns = {self.columns[k]: _array2d(pa, features[self.columns[k]],
                                             self._gather(k, windows, offsets))
                   for k in self.keys}
        ids = self._gather(INPUT_IDS, windows, offsets).astype(np.int32, copy=False)
        columns["token_ids"] = pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)),
                                                                 self.context)
        columns["index"] = pa.array(windows.astype(np.int64))
        return pa.table(columns, schema=features.arrow_schema)

    def _gather(self, key: str, windows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        # the windows' rows, read in file order, a run of neighbouring windows per read
        dataset = self.source[key]
        out = np.empty((len(windows), self.context, *dataset.shape[1:]),
                       dtype=_dtype(self.source, key) if key != INPUT_IDS else dataset.dtype)
        place = np.argsort(windows, kind="stable")
        ordered = windows[place]
        breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
        for run in np.split(np.arange(len(ordered)), breaks):
            if not len(run):
                continue
            first = int(offsets[ordered[run[0]]])
            rows = np.asarray(dataset[first:first + len(run) * self.context])
            out[place[run]] = rows.reshape(len(run), self.context, *dataset.shape[1:])
        return out

    def _write_state(self, folder: Path, features, files: list[str]) -> None:
        # what Dataset.save_to_disk writes beside its arrow files, for load_from_disk
        from datasets import DatasetInfo

        made_of = json.dumps([str(self.source.path.resolve()),
                              str(self.source.file.attrs.get("created", "")), self.columns,
                              self.seed])
        state = {"_data_files": [{"filename": name} for name in files],
                 "_fingerprint": hashlib.sha256(made_of.encode()).hexdigest()[:16],
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                 "_output_all_columns": False, "_split": None}
        (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        info = asdict(DatasetInfo(
            description=f"probe export of {self.source.path.name}: contexts of "
                        f"{self.context} tokens, a column per layer", features=features))
        (folder / "dataset_info.json").write_text(
            json.dumps({key: info[key] for key in sorted(info)}, indent=2))


def cache_features(widths: dict[str, int], context: int, dtypes: dict[str, np.dtype]):
    """The ``datasets.Features`` of the folder: SAELens' cache runner's, a column per hook,
    and the window's index."""
    from datasets import Array2D, Features, Sequence, Value

    features = {name: Array2D(shape=(context, width), dtype=str(dtypes[name]))
                for name, width in widths.items()}
    features["token_ids"] = Sequence(Value(dtype="int32"), length=context)
    features["index"] = Value(dtype="int64")
    return Features(features)


def _token_keys(source: Source, chosen: bool) -> list[str]:
    fits = [k for k in source.keys if source.per_token(k) and len(source[k].shape) == 2]
    unfit = [k for k in source.keys if k not in fits]
    if unfit and not chosen:
        log.info("to=saelens leaves out the keys without a vector per token: %s",
                 ", ".join(unfit))
    if unfit and chosen:
        shapes = ", ".join(f"{k} {tuple(source[k].shape)}" for k in unfit)
        raise ConfigError(f"to=saelens takes keys with a vector per token, (tokens, d); "
                          f"{shapes} is not one; leave it out of keys=[...]")
    if not fits:
        raise ConfigError(f"to=saelens found no key with a vector per token in "
                          f"{str(source.path)!r} (it holds {source.keys}); run probe with "
                          "tokens=all")
    return fits


def _column_names(keys: list[str], names: dict[str, str]) -> dict[str, str]:
    layers = [split_key(k)[0] for k in keys]
    unused = [n for n in names if n not in keys and n not in layers]
    if unused:
        raise ConfigError(f"names= maps {unused[0]!r}, which is not a layer or key of the "
                          f"export ({keys}); name a layer, or <layer>/<kind>")
    columns = {}
    for key, layer in zip(keys, layers, strict=True):
        default = layer if layers.count(layer) == 1 else key
        columns[key] = str(names.get(key, names.get(layer, default)))
    taken = list(columns.values())
    clash = next((c for c in taken if taken.count(c) > 1 or c in ("token_ids", "index")), None)
    if clash is not None:
        raise ConfigError(f"to=saelens would write two columns named {clash!r}; give each "
                          "layer its own name with names={layer: name}")
    return columns


def _dtype(source: Source, key: str) -> np.dtype:
    dtype = source.dtype(key)
    return dtype if dtype in (np.float16, np.float32, np.float64) else np.dtype("float32")


def _array2d(pa, feature, rows: np.ndarray):
    # (B, context, d) as datasets' Array2D storage (lists of lists), sharing the values
    from datasets.features.features import Array2DExtensionType

    count, context, width = rows.shape
    values = pa.array(np.ascontiguousarray(rows).reshape(-1))
    inner = pa.ListArray.from_arrays(pa.array(np.arange(0, count * context * width + 1, width,
                                                        dtype=np.int32)), values)
    outer = pa.ListArray.from_arrays(pa.array(np.arange(0, count * context + 1, context,
                                                        dtype=np.int32)), inner)
    return pa.ExtensionArray.from_storage(Array2DExtensionType(feature.shape, feature.dtype),
                                          outer)
