"""Join the files of a sharded run into one (``python -m probe.merge -o OUT SHARD...``).

Each shard file holds the rows ``i % count == index`` of the same config. The merged file maps
its datasets onto the shard files through HDF5 virtual datasets (no copy; keep the shard files
beside it), or with ``--copy`` holds the values itself. It has the layout and attrs of a normal
file, so plain h5py and ``probe.open`` read it. Its rows are in dataset order; those of a text
run (rows per token), and of shards that left samples out (dataset.on_error=skip), come shard
after shard instead, each shard in dataset order, with ``/offsets`` rewritten and ``/index``
saying which sample each row is (attr merged_order); ``/skipped`` joins the shards', sorted.

Shards need not come from one split: a torchrun job's ranks are shards of a finer split
(probe.pipeline.shards), and ``into=(c, C)`` merges the ranks of job c into a file that is
itself shard c of C. A shard that is such a virtual merge stands for the files it maps, so a
merge of the jobs' files maps the rank files directly, and every set of shards whose rows cover
the run once merges.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import h5py
import numpy as np
import yaml

from probe.errors import OutputError
from probe.file.format import (
    DECODER_OFFSETS,
    FILE,
    INDEX,
    OFFSETS,
    SKIPPED,
    TARGET,
    Attr,
    dataset_names,
    in_transform,
    partial_path,
    read_state,
)
from probe.file.recorded import differing_keys
from probe.file.store import chunk_shape, filter_options
from probe.file.transforms import PARTS, read_transforms, write_transforms

__all__ = ["merge", "missing_value", "ShardsMissing"]

log = logging.getLogger(__name__)


class ShardsMissing(OutputError):
    """Some shards of the run are not there, or not finished: nothing is wrong with those that
    are (a sweep that ran some shards only leaves its set unmerged for this reason alone)."""


# what may differ between the shards of one run (the cover check below sees to the rest)
_SHARD_KEYS = ("shard.index", "shard.count")
_COPY_BLOCK_BYTES = 64 << 20  # rows held in memory at once by a --copy merge


def merge(out: str | Path, shards: Sequence[str | Path], *, copy: bool = False,
          overwrite: bool = False, into: tuple[int, int] = (0, 1)) -> Path:
    """Merge complete shard files of one config into ``out``: the whole run, or with
    ``into=(index, count)`` the shard ``index`` of ``count`` that they split further.

    Raises:
        OutputError: a shard is missing, incomplete, repeated, of another config or outside
            ``into``, or ``out`` exists (unless ``overwrite``); nothing is left at ``out`` then.
    """
    assert 0 <= into[0] < into[1], into
    out = Path(out).absolute()
    paths = [source for s in shards for source in _sources(Path(s))]
    infos = sorted(map(_read_shard, paths), key=lambda info: (info["index"], info["count"]))
    interleaved = _check_shards(infos, into)
    if out.exists() and not overwrite:
        raise OutputError(f"{str(out)!r} exists; choose another -o or pass --overwrite")
    tmp = partial_path(out)
    try:
        with h5py.File(tmp, "w") as f:
            _write_merged(f, infos, out.parent, copy, into, interleaved)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("merged %d shards, %d rows, into %s (%s)", len(infos),
             sum(i["rows"] for i in infos), out, "copied" if copy else "virtual")
    return out


def _sources(path: Path) -> list[Path]:
    """The shard files that ``path`` stands for: those it maps, when it is a virtual merge
    (a torchrun job's file, say), else itself."""
    sources: dict[str, None] = {}
    try:
        with h5py.File(path, "r") as f:
            if Attr.MERGED_FROM in f.attrs:
                for dataset in map(f.__getitem__, dataset_names(f)):
                    if dataset.is_virtual:
                        sources.update((s.file_name, None) for s in dataset.virtual_sources()
                                       if s.file_name != ".")
    except OSError:
        pass  # _read_shard says what is wrong with it
    if not sources:  # not merged, or a --copy merge, which holds its rows itself
        return [path]
    # relative names, as merge writes them, are relative to the merged file's folder
    return [p for name in sources for p in _sources(path.parent / name)]


def _read_shard(path: Path) -> dict:
    if not path.is_file():
        hint = " (its run has not finished)" if partial_path(path).exists() else ""
        raise ShardsMissing(f"shard {str(path)!r} does not exist{hint}")
    try:
        with h5py.File(path, "r") as f:
            state = read_state(f, path)
            datasets = {name: (f[name].shape, f[name].dtype, dict(f[name].attrs))
                        for name in dataset_names(f)}
            index = f[INDEX][:]
    except (OSError, KeyError) as err:
        raise OutputError(f"shard {str(path)!r} is not a readable probe file ({err})") from None
    if not state.complete:
        raise ShardsMissing(f"shard {str(path)!r} is not complete; run its job again to "
                            "finish it")
    return {"path": path.absolute(), "attrs": state.attrs, "datasets": datasets,
            "index_rows": index, "config": yaml.safe_load(state.config), "rows": len(index),
            "index": int(state.attrs[Attr.SHARD_INDEX]),
            "count": int(state.attrs[Attr.SHARD_COUNT])}


def _check_shards(infos: list[dict], into: tuple[int, int]) -> bool:
    """Refuse shards that are not one run's; whether their rows interleave into it (they do
    not where shards left samples out: those go shard after shard)."""
    if not infos:
        raise OutputError("no shard files given")
    first = infos[0]
    for info in infos[1:]:
        differing = [k for k in differing_keys(first["config"], info["config"])
                     if k not in _SHARD_KEYS]
        # the same interventions may have read other vectors or source files
        key = Attr.INTERVENTION_FINGERPRINT
        if first["attrs"].get(key) != info["attrs"].get(key):
            differing.append("the interventions' vectors, means or source files")
        if not _same_transforms(first["path"], info["path"]):  # pca fitted on other rows
            differing.append("the transforms of reduce=pca|srp (fitted on other rows: "
                             "reduce_fit_samples, subset or seed, or another machine's rounding)")
        if differing:
            raise OutputError(
                f"shard {str(info['path'])!r} comes from another config than "
                f"{str(first['path'])!r} (differs in: {', '.join(differing)})"
            )
    # Where each shard's rows go in the merged file: rows start, start + step, ... Shard i of n
    # holds positions i, i + n, ... of the run; the merged file holds those of shard c of C.
    index, count = into
    for info in infos:
        if info["count"] % count or info["index"] % count != index:
            raise OutputError(f"shard {info['index']} of {info['count']} "
                              f"({str(info['path'])!r}) is not a part of shard {index} of {count}")
        info["start"], info["step"] = (info["index"] - index) // count, info["count"] // count
    _check_cover(infos, into)
    total = sum(info["rows"] for info in infos)
    sizes = [info["rows"] for info in infos]
    if any(SKIPPED in info["datasets"] for info in infos):
        return False
    if sizes != [len(range(info["start"], total, info["step"])) for info in infos]:
        raise OutputError(f"the shards' row counts {sizes} do not tile one run")
    # A text run's merge holds its shards one after another; a shard that is such a merge
    # (a --copy of a torchrun job's file) has its rows in the order of its own shards.
    by_shard = OFFSETS in first["datasets"]
    merged = np.empty(total, dtype=np.int64)
    for info in infos:
        rows = np.sort(info["index_rows"]) if by_shard else info["index_rows"]
        merged[info["start"]::info["step"]] = rows
    if len(merged) > 1 and not (np.diff(merged) > 0).all():
        raise OutputError("the shards' rows do not interleave into one run's (dataset order): "
                          f"is every shard of the same {first['count']}-way split?")
    return True


def _check_cover(infos: list[dict], into: tuple[int, int]) -> None:
    """Every row of the merged file comes from exactly one shard."""
    seen: dict[tuple[int, int], Path] = {}
    for info in infos:
        key = (info["index"], info["count"])
        if key in seen:
            raise OutputError(f"shard {key[0]} of {key[1]} is given twice: {str(seen[key])!r} "
                              f"and {str(info['path'])!r}")
        seen[key] = info["path"]
    steps = {info["step"] for info in infos}
    if len(steps) == 1:  # shards of one split: say which are missing
        (step,) = steps
        missing = sorted(set(range(step)) - {info["start"] for info in infos})
        if missing:
            named = [into[0] + into[1] * start for start in missing]
            raise ShardsMissing(f"shard(s) {named} of {infos[0]['count']} are missing; pass "
                                "every shard file")
        return
    # shards of several splits (one job's ranks beside another job's file): the positions
    # start mod step of two shards meet unless the starts differ modulo gcd(steps)
    for a, b in itertools.combinations(infos, 2):
        if (a["start"] - b["start"]) % math.gcd(a["step"], b["step"]) == 0:
            raise OutputError(f"shard {a['index']} of {a['count']} ({str(a['path'])!r}) and "
                              f"shard {b['index']} of {b['count']} ({str(b['path'])!r}) hold "
                              "some of the same samples")
    if sum(Fraction(1, info["step"]) for info in infos) != 1:
        raise ShardsMissing(f"the shards {sorted(seen)} (index, count) leave samples out; "
                            "pass every shard file")


def _write_merged(f: h5py.File, infos: list[dict], directory: Path, copy: bool,
                  into: tuple[int, int], interleaved: bool) -> None:
    total = sum(info["rows"] for info in infos)
    # Rows per token (text runs): shard after shard. Interleaving documents of many lengths would
    # take one virtual mapping per document; this way each dataset maps one block per shard.
    # So do the rows of shards that left samples out, which no longer interleave.
    by_shard = OFFSETS in infos[0]["datasets"] or not interleaved
    attrs = dict(infos[0]["attrs"])
    config = dict(infos[0]["config"])
    config["shard"] = {"index": into[0], "count": into[1]}
    attrs.update({Attr.CONFIG: yaml.safe_dump(config, sort_keys=False),
                  Attr.NUM_SAMPLES: total, Attr.NUM_COMMITTED: total, Attr.COMPLETE: True,
                  Attr.SHARD_INDEX: into[0], Attr.SHARD_COUNT: into[1],
                  # relative, as the virtual links are: the tree can move as a whole
                  Attr.MERGED_FROM: np.array([os.path.relpath(i["path"], directory)
                                              for i in infos],
                                             dtype=h5py.string_dtype()),
                  Attr.MERGED_ORDER: "shards" if by_shard else "dataset"})
    f.attrs.update(attrs)
    with h5py.File(infos[0]["path"], "r") as shard:
        write_transforms(f, read_transforms(shard))
    output = config.get("output") or {}
    for name, (_, dtype, dataset_attrs) in infos[0]["datasets"].items():
        if in_transform(name):  # the same in every shard: one copy
            continue
        if name == SKIPPED:  # the samples every shard left out, in dataset order
            left_out = np.sort(np.concatenate([_read(info["path"], SKIPPED) for info in infos]))
            f.create_dataset(name, data=left_out, maxshape=(None,)).attrs.update(dataset_attrs)
            f.attrs[Attr.NUM_SKIPPED] = len(left_out)
            continue
        shapes = [info["datasets"][name][0] for info in infos]
        bounds = name in (OFFSETS, DECODER_OFFSETS)
        full_shape = (sum(shape[0] for shape in shapes) - (len(infos) - 1) * bounds,
                      *shapes[0][1:])
        # Small per-sample datasets are copied; so are strings (a file name, a caption, a
        # transcript), which HDF5 cannot map: h5py has no conversion for a virtual dataset of
        # variable-length strings.
        bookkeeping = bounds or name in (INDEX, TARGET, FILE) or _is_string(dtype)
        if bookkeeping or copy:
            options = {} if bookkeeping else filter_options(output.get("compression", "none"),
                                                            output.get("compression_level"))
            dataset = f.create_dataset(
                name, shape=full_shape, dtype=dtype, **options,
                chunks=chunk_shape(full_shape[1:], dtype.itemsize, max(1, full_shape[0]),
                                   compressed=bool(options)))
            if bounds:
                dataset[:] = _merged_offsets(infos, name)
            elif by_shard:
                _copy_shards(dataset, name, infos)
            else:
                _copy_rows(dataset, name, infos)
        else:
            layout = h5py.VirtualLayout(shape=full_shape, dtype=dtype)
            start = 0
            for info, shape in zip(infos, shapes, strict=True):
                # relative paths, so the merged file and its shards can move together
                source = h5py.VirtualSource(_literal(os.path.relpath(info["path"], directory)),
                                            _literal(name), shape=shape)
                if by_shard:
                    layout[start:start + shape[0]] = source
                    start += shape[0]
                else:
                    layout[info["start"]::info["step"]] = source
            dataset = f.create_virtual_dataset(name, layout, fillvalue=missing_value(dtype))
        dataset.attrs.update(dataset_attrs)


def _literal(name: str) -> str:
    """A file or dataset name as a virtual dataset's source takes it: HDF5 reads a % there
    as a printf-style pattern (%b), so a literal one (blocks.50%) is written %%."""
    return name.replace("%", "%%")


def _same_transforms(a: Path, b: Path) -> bool:
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        first, second = read_transforms(f), read_transforms(g)
    if first.keys() != second.keys():
        return False
    return all(np.array_equal(first[key][part], second[key][part])
               for key in first for part in PARTS if first[key][part] is not None)


def _is_string(dtype: np.dtype) -> bool:
    return h5py.check_string_dtype(dtype) is not None or h5py.check_vlen_dtype(dtype) is not None


def _read(path: Path, name: str) -> np.ndarray:
    with h5py.File(path, "r") as shard:
        return shard[name][:]


def _merged_offsets(infos: list[dict], name: str) -> np.ndarray:
    # the bounds of the shards' rows per token (/offsets, /decoder_offsets), shard after shard
    parts, shift = [], 0
    for info in infos:
        with h5py.File(info["path"], "r") as shard:
            offsets = shard[name][:]
        parts.append(offsets[:-1] + shift)
        shift += int(offsets[-1])
    return np.concatenate([*parts, [shift]])


def _copy_shards(dataset: h5py.Dataset, name: str, infos: list[dict]) -> None:
    # shard after shard, a block of rows at a time
    start = 0
    for info in infos:
        with h5py.File(info["path"], "r") as shard:
            source = shard[name]
            for first, last in _blocks(dataset, source.shape[0]):
                dataset[start + first:start + last] = source[first:last]
            start += source.shape[0]


def _blocks(dataset: h5py.Dataset, total: int) -> list[tuple[int, int]]:
    # whole chunks of the output adding up to about _COPY_BLOCK_BYTES
    row_bytes = max(1, dataset.dtype.itemsize * int(np.prod(dataset.shape[1:])))
    rows = dataset.chunks[0] * max(1, _COPY_BLOCK_BYTES // (row_bytes * dataset.chunks[0]))
    return [(start, min(start + rows, total)) for start in range(0, total, rows)]


def missing_value(dtype: np.dtype):
    """What a virtual dataset shows where its source file is missing: a value that cannot pass
    for data (NaN for floats, -1 for integers), so even plain h5py shows the gap."""
    return np.nan if np.dtype(dtype).kind == "f" else -1


def _copy_rows(dataset: h5py.Dataset, name: str, infos: list[dict]) -> None:
    # Row start + k * step of the merged file is row k of that shard. Copy a block of whole
    # output chunks at a time, so memory stays bounded by the block, not the dataset.
    with contextlib.ExitStack() as stack:
        shards = [stack.enter_context(h5py.File(info["path"], "r"))[name] for info in infos]
        for start, stop in _blocks(dataset, dataset.shape[0]):
            block = np.empty((stop - start, *dataset.shape[1:]), dataset.dtype)
            for info, source in zip(infos, shards, strict=True):
                first_row, step = info["start"], info["step"]
                first = (start - first_row + step - 1) // step  # the shard's first row in it
                last = (stop - first_row + step - 1) // step
                block[first * step + first_row - start::step] = source[first:last]
            dataset[start:stop] = block
