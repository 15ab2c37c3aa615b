"""Join the files of a sharded run into one (``python -m probe.merge -o OUT SHARD...``).

Each shard file holds the rows ``i % count == index`` of the same config. The merged file maps
its datasets onto the shard files through HDF5 virtual datasets (no copy; keep the shard files
beside it), or with ``--copy`` holds the values itself. It has the layout and attrs of a normal
file, so plain h5py and ``probe.open`` read it. Its rows are in dataset order; those of a text
run (rows per token) come shard after shard instead, each shard in dataset order, with
``/offsets`` rewritten and ``/index`` saying which sample each row is (attr merged_order).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import yaml

from probe.config import differing_keys
from probe.errors import OutputError
from probe.format import (
    FILE,
    INDEX,
    OFFSETS,
    SKIPPED,
    TARGET,
    Attr,
    dataset_names,
    partial_path,
    read_state,
)
from probe.store import chunk_shape, filter_options

__all__ = ["merge", "missing_value"]

log = logging.getLogger(__name__)

_SHARD_KEYS = ("shard.index",)
_COPY_BLOCK_BYTES = 64 << 20  # rows held in memory at once by a --copy merge


def merge(out: str | Path, shards: Sequence[str | Path], *, copy: bool = False,
          overwrite: bool = False) -> Path:
    """Merge complete shard files of one config into ``out``.

    Raises:
        OutputError: a shard is missing, incomplete, repeated or of another config, or ``out``
            exists (unless ``overwrite``); nothing is left at ``out`` then.
    """
    out = Path(out).absolute()
    infos = sorted((_read_shard(Path(s)) for s in shards), key=lambda info: info["index"])
    interleaved = _check_shards(infos)
    if out.exists() and not overwrite:
        raise OutputError(f"{str(out)!r} exists; choose another -o or pass --overwrite")
    tmp = partial_path(out)
    try:
        with h5py.File(tmp, "w") as f:
            _write_merged(f, infos, out.parent, copy, interleaved)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("merged %d shards, %d rows, into %s (%s)", len(infos),
             sum(i["rows"] for i in infos), out, "copied" if copy else "virtual")
    return out


def _read_shard(path: Path) -> dict:
    if not path.is_file():
        hint = " (its run has not finished)" if partial_path(path).exists() else ""
        raise OutputError(f"shard {str(path)!r} does not exist{hint}")
    try:
        with h5py.File(path, "r") as f:
            state = read_state(f, path)
            datasets = {name: (f[name].shape, f[name].dtype, dict(f[name].attrs))
                        for name in dataset_names(f)}
            index = f[INDEX][:]
    except (OSError, KeyError) as err:
        raise OutputError(f"shard {str(path)!r} is not a readable probe file ({err})") from None
    if not state.complete:
        raise OutputError(f"shard {str(path)!r} is not complete; run its job again to finish it")
    return {"path": path.absolute(), "attrs": state.attrs, "datasets": datasets,
            "index_rows": index, "config": yaml.safe_load(state.config), "rows": len(index),
            "index": int(state.attrs[Attr.SHARD_INDEX]),
            "count": int(state.attrs[Attr.SHARD_COUNT])}


def _check_shards(infos: list[dict]) -> bool:
    """Refuse shards that are not one run's; whether their rows interleave into it."""
    if not infos:
        raise OutputError("no shard files given")
    first = infos[0]
    for info in infos[1:]:
        differing = [k for k in differing_keys(first["config"], info["config"])
                     if k not in _SHARD_KEYS]
        if differing:
            raise OutputError(
                f"shard {str(info['path'])!r} comes from another config than "
                f"{str(first['path'])!r} (differs in: {', '.join(differing)})"
            )
    count = first["count"]
    seen: dict[int, Path] = {}
    for info in infos:
        if info["index"] in seen:
            raise OutputError(
                f"shard {info['index']} of {count} is given twice: {str(seen[info['index']])!r} "
                f"and {str(info['path'])!r}"
            )
        seen[info["index"]] = info["path"]
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise OutputError(f"shard(s) {missing} of {count} are missing; pass every shard file")
    # shard k holds rows k, k + count, ... of the run's samples, which are in dataset order;
    # where shards left samples out (dataset.on_error=skip), their rows go shard after shard
    sizes = [info["rows"] for info in infos]
    tiled = max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    merged = np.empty(sum(sizes), dtype=np.int64)
    if tiled:
        for info in infos:
            merged[info["index"]::count] = info["index_rows"]
    interleaved = tiled and (len(merged) < 2 or bool((np.diff(merged) > 0).all()))
    if not interleaved and not any(SKIPPED in info["datasets"] for info in infos):
        raise OutputError(f"the shards' row counts {sizes} do not tile one run" if not tiled else
                          "the shards' rows do not interleave into one run's (dataset order): "
                          f"is every shard of the same {count}-way split?")
    return interleaved


def _write_merged(f: h5py.File, infos: list[dict], directory: Path, copy: bool,
                  interleaved: bool) -> None:
    total = sum(info["rows"] for info in infos)
    # Rows per token (text runs): shard after shard. Interleaving documents of many lengths would
    # take one virtual mapping per document; this way each dataset maps one block per shard.
    by_shard = OFFSETS in infos[0]["datasets"] or not interleaved
    attrs = dict(infos[0]["attrs"])
    config = dict(infos[0]["config"])
    config["shard"] = {"index": 0, "count": 1}
    attrs.update({Attr.CONFIG: yaml.safe_dump(config, sort_keys=False),
                  Attr.NUM_SAMPLES: total, Attr.NUM_COMMITTED: total, Attr.COMPLETE: True,
                  Attr.SHARD_INDEX: 0, Attr.SHARD_COUNT: 1,
                  Attr.MERGED_FROM: np.array([str(i["path"]) for i in infos],
                                             dtype=h5py.string_dtype()),
                  Attr.MERGED_ORDER: "shards" if by_shard else "dataset"})
    f.attrs.update(attrs)
    output = config.get("output") or {}
    for name, (_, dtype, dataset_attrs) in infos[0]["datasets"].items():
        if name == SKIPPED:  # the samples every shard left out, in dataset order
            left_out = np.sort(np.concatenate([_read(info["path"], SKIPPED) for info in infos]))
            f.create_dataset(name, data=left_out, maxshape=(None,)).attrs.update(dataset_attrs)
            f.attrs[Attr.NUM_SKIPPED] = len(left_out)
            continue
        shapes = [info["datasets"][name][0] for info in infos]
        full_shape = (sum(shape[0] for shape in shapes) - (len(infos) - 1) * (name == OFFSETS),
                      *shapes[0][1:])
        bookkeeping = name in (INDEX, TARGET, OFFSETS, FILE)
        if bookkeeping or copy:
            options = {} if bookkeeping else filter_options(output.get("compression", "none"),
                                                            output.get("compression_level"))
            dataset = f.create_dataset(
                name, shape=full_shape, dtype=dtype, **options,
                chunks=chunk_shape(full_shape[1:], dtype.itemsize, max(1, full_shape[0]),
                                   compressed=bool(options)))
            if name == OFFSETS:
                dataset[:] = _merged_offsets(infos)
            elif by_shard:
                _copy_shards(dataset, name, infos)
            else:
                _copy_rows(dataset, name, infos)
        else:
            layout = h5py.VirtualLayout(shape=full_shape, dtype=dtype)
            start = 0
            for info, shape in zip(infos, shapes, strict=True):
                # relative paths, so the merged file and its shards can move together
                source = h5py.VirtualSource(os.path.relpath(info["path"], directory), name,
                                            shape=shape)
                if by_shard:
                    layout[start:start + shape[0]] = source
                    start += shape[0]
                else:
                    layout[info["index"]::len(infos)] = source
            dataset = f.create_virtual_dataset(name, layout, fillvalue=missing_value(dtype))
        dataset.attrs.update(dataset_attrs)


def _read(path: Path, name: str) -> np.ndarray:
    with h5py.File(path, "r") as shard:
        return shard[name][:]


def _merged_offsets(infos: list[dict]) -> np.ndarray:
    parts, shift = [], 0
    for info in infos:
        with h5py.File(info["path"], "r") as shard:
            offsets = shard[OFFSETS][:]
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
    # Row g of the merged file is row g // count of shard g % count. Copy a block of whole
    # output chunks at a time, so memory stays bounded by the block, not the dataset.
    count = len(infos)
    with contextlib.ExitStack() as stack:
        shards = [stack.enter_context(h5py.File(info["path"], "r"))[name] for info in infos]
        for start, stop in _blocks(dataset, dataset.shape[0]):
            block = np.empty((stop - start, *dataset.shape[1:]), dataset.dtype)
            for k, source in enumerate(shards):
                first = (start - k + count - 1) // count  # the shard's first row in the block
                last = (stop - k + count - 1) // count
                block[first * count + k - start::count] = source[first:last]
            dataset[start:stop] = block
