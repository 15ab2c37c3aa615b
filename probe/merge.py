"""Join the files of a sharded run into one: ``python -m probe.merge -o OUT SHARD...``.

Each shard file holds the rows ``i % count == index`` of the same config. The merged file maps
its datasets onto the shard files through HDF5 virtual datasets (no copy; keep the shard files
beside it), or with ``--copy`` holds the values itself. Its rows are in global index order and
it has the layout and attrs of a normal file, so plain h5py and ``probe.open`` read it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import yaml
from hydra.experimental.callback import Callback

from probe.cli import exit_on_user_error
from probe.errors import OutputError, ProbeError
from probe.store import differing_keys, partial_path

__all__ = ["merge", "MergeShards"]

log = logging.getLogger(__name__)

_SHARD_KEYS = ("shard.index",)


def merge(out: str | Path, shards: Sequence[str | Path], *, copy: bool = False,
          overwrite: bool = False) -> Path:
    """Merge complete shard files of one config into ``out``.

    Raises:
        OutputError: a shard is missing, incomplete, repeated or of another config, or ``out``
            exists (unless ``overwrite``); nothing is left at ``out`` then.
    """
    out = Path(out).absolute()
    infos = sorted((_read_shard(Path(s)) for s in shards), key=lambda info: info["index"])
    _check_shards(infos)
    if out.exists() and not overwrite:
        raise OutputError(f"{str(out)!r} exists; choose another -o or pass --overwrite")
    tmp = partial_path(out)
    try:
        with h5py.File(tmp, "w") as f:
            _write_merged(f, infos, out.parent, copy)
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
            attrs = dict(f.attrs)
            datasets: dict[str, tuple] = {}
            f.visititems(lambda name, obj: datasets.__setitem__(name, (obj.shape, obj.dtype,
                                                                       dict(obj.attrs)))
                         if isinstance(obj, h5py.Dataset) else None)
            index = f["index"][:]
    except (OSError, KeyError) as err:
        raise OutputError(f"shard {str(path)!r} is not a readable probe file ({err})") from None
    if not attrs.get("complete", False):
        raise OutputError(f"shard {str(path)!r} is not complete; run its job again to finish it")
    return {"path": path.absolute(), "attrs": attrs, "datasets": datasets, "index_rows": index,
            "config": yaml.safe_load(str(attrs["config"])), "rows": len(index),
            "index": int(attrs["shard_index"]), "count": int(attrs["shard_count"])}


def _check_shards(infos: list[dict]) -> None:
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
    for info in infos:
        expected = np.arange(info["index"], info["index"] + count * info["rows"], count)
        if not np.array_equal(info["index_rows"], expected):
            raise OutputError(f"shard {str(info['path'])!r} does not hold the rows i % {count} "
                              f"== {info['index']} in order")
    sizes = [info["rows"] for info in infos]
    if max(sizes) - min(sizes) > 1 or sizes != sorted(sizes, reverse=True):
        raise OutputError(f"the shards' row counts {sizes} do not tile one run")


def _write_merged(f: h5py.File, infos: list[dict], directory: Path, copy: bool) -> None:
    count, total = infos[0]["count"], sum(info["rows"] for info in infos)
    attrs = dict(infos[0]["attrs"])
    config = dict(infos[0]["config"])
    config["shard"] = {"index": 0, "count": 1}
    attrs.update(config=yaml.safe_dump(config, sort_keys=False), num_samples=total,
                 num_committed=total, complete=True, shard_index=0, shard_count=1,
                 merged_from=np.array([str(i["path"]) for i in infos], dtype=h5py.string_dtype()))
    f.attrs.update(attrs)
    for name, (shape, dtype, dataset_attrs) in infos[0]["datasets"].items():
        full_shape = (total, *shape[1:])
        if name in ("index", "target") or copy:
            values = np.empty(full_shape, dtype)
            for info in infos:
                with h5py.File(info["path"], "r") as shard:
                    values[info["index"]::count] = shard[name][:]
            dataset = f.create_dataset(name, data=values, chunks=True if values.ndim else None)
        else:
            layout = h5py.VirtualLayout(shape=full_shape, dtype=dtype)
            for info in infos:
                # relative paths, so the merged file and its shards can move together
                source = os.path.relpath(info["path"], directory)
                layout[info["index"]::count] = h5py.VirtualSource(
                    source, name, shape=(info["rows"], *shape[1:]))
            dataset = f.create_virtual_dataset(name, layout)
        dataset.attrs.update(dataset_attrs)


class MergeShards(Callback):
    """A Hydra callback (see conf/config.yaml): at the end of a multirun, each complete set of
    shard files in the sweep folder is merged into ``<sweep dir>/<the jobs' folder name without
    shard.index>.h5``, with virtual datasets. Sets that are incomplete, or already merged, are
    left alone; a set that cannot be merged is logged and skipped, so the sweep still succeeds.
    """

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        groups: dict[str, list[Path]] = {}
        for shard in sorted(sweep_dir.glob("*/features.h5")):
            name, count = re.subn(r"\+?shard\.index-\d+", "", shard.parent.name)
            if count and "shard.count-" in name:
                groups.setdefault(name.strip("+"), []).append(shard)
        for name, shards in groups.items():
            out = sweep_dir / f"{name}.h5"
            if out.exists():
                continue
            try:
                merge(out, shards)
            except ProbeError as err:
                log.info("not merging the shards of %s: %s", name, err)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m probe.merge", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="the merged file to write")
    parser.add_argument("shards", nargs="+", help="the shard files (features.h5 of each job)")
    parser.add_argument("--copy", action="store_true",
                        help="write a self-contained file instead of virtual datasets")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    exit_on_user_error(lambda a: merge(a.output, a.shards, copy=a.copy,
                                       overwrite=a.overwrite))(args)


if __name__ == "__main__":
    main()
