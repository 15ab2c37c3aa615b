"""A probe file for the next tool: ``python -m probe.export file=A.h5 to=ROUTE``.

    probe.file.exports.npy       D/<layer>/<kind>.npy, D/index.npy, ... (np.load, mmap_mode="r")
    probe.file.exports.parquet   D/<stem>.parquet: a row per stored row (pyarrow, pandas, DuckDB)
    probe.file.exports.mat       D/<stem>.mat: MATLAB v5 (scipy.io.loadmat, MATLAB's load)
    probe.file.exports.saelens   D: a datasets folder of shuffled contexts (SAELens' cache)
    probe.file.exports.stream    the file, its keys, and its rows in blocks of a byte budget
    probe.file.exports.folder    the folder written beside and renamed whole; what was written

Example::

    from probe.file.exports import export
    done = export("feats/gpt2.h5", "saelens", seed=0,
                  names={"transformer.h.6": "blocks.6.hook_resid_post"})
    print("\\n".join(done.lines()))

Every route streams: it holds one block of rows (``memory_mb``) at a time, whatever the file's
size, and writes nothing until every check has passed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from probe.errors import ConfigError
from probe.file.exports.folder import Exported, Written, check_out_dir, default_out_dir, staged
from probe.file.exports.stream import Source

__all__ = ["export", "ROUTES", "Exported", "default_out_dir"]

ROUTES = ("npy", "parquet", "mat", "saelens")
_NEEDS = {"npy": (), "parquet": ("pyarrow",), "mat": ("scipy",), "saelens": ("pyarrow", "datasets")}


def export(file: str | Path, to: str, *, keys: Sequence[str] | None = None,
           out_dir: str | Path | None = None, seed: int | None = 0,
           names: Mapping[str, str] | None = None, overwrite: bool = False,
           memory_mb: float = 256) -> Exported:
    """Write the keys of a finished probe file in the format of ``to``, into ``out_dir``.

    Args:
        file: the probe file.
        to: npy | parquet | mat | saelens.
        keys: "<layer>/<kind>" or "<layer>" (its every kind); None: every stored key (saelens:
            every key with a vector per token).
        out_dir: the folder to write (default ``<file stem>_export`` beside the file); it is
            written beside and renamed into place once complete.
        seed: saelens: seeds the shuffle of the contexts; None keeps the file's order.
        names: saelens: column names by layer or key (the hook names a trainer expects).
        overwrite: replace an ``out_dir`` that is not empty.
        memory_mb: MiB of rows held at once.

    Raises:
        ConfigError: an unknown route or key, a key the route cannot write, a bad value.
        DataError: no such file, or not a probe file.
        OutputError: a partial file, an ``out_dir`` that is not empty, or one that cannot be
            written.
    """
    to = _route(to)
    if names is not None and not isinstance(names, Mapping):
        raise ConfigError(f"names={names!r} is not a mapping; pass names={{layer: name, ...}}")
    if names and to != "saelens":
        raise ConfigError(f"names= names the columns of to=saelens, not of to={to}; leave it out")
    if not memory_mb > 0:
        raise ConfigError(f"memory_mb={memory_mb} must be more than 0 (MiB of rows at once)")
    if keys is not None and not len(keys):
        raise ConfigError("keys=[] names no key; leave keys out for every stored key")
    with Source(file, keys) as source:
        out_dir = Path(out_dir) if out_dir is not None else default_out_dir(source.path)
        check_out_dir(out_dir, source=source.path, overwrite=overwrite)
        route = _prepare(to, source, seed=seed, names=dict(names or {}), chosen=keys is not None)
        with staged(out_dir, source=source.path, overwrite=overwrite) as folder:
            written = route.write(folder, int(memory_mb * 2**20))
    files = [Written(out_dir / path, rows) for path, rows in written]
    return Exported(to, out_dir, files, notes=list(getattr(route, "notes", [])))


def _route(to: str | None) -> str:
    if to not in ROUTES:
        raise ConfigError(f"to={to!r} is not an export; choose one of {', '.join(ROUTES)} "
                          "(to=npy, for instance)")
    return str(to)


def _prepare(to: str, source: Source, *, seed: int | None, names: dict[str, str],
             chosen: bool):
    # every check a route makes happens here, before a folder exists
    for module in _NEEDS[to]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"to={to} needs {module}: pip install 'probe[export]'") from None
    if not source.keys and to != "npy":
        raise ConfigError(f"{str(source.path)!r} holds no <layer>/<kind> to export to={to}")
    if to == "npy":
        from probe.file.exports.npy import NpyExport

        return NpyExport(source)
    if to == "parquet":
        from probe.file.exports.parquet import ParquetExport

        return ParquetExport(source)
    if to == "mat":
        from probe.file.exports.mat import MatExport

        return MatExport(source)
    from probe.file.exports.saelens import SaelensExport

    return SaelensExport(source, seed=seed, names=names, chosen=chosen)
