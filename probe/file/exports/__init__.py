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
from dataclasses import dataclass
from pathlib import Path

from probe.errors import ConfigError
from probe.file.exports.folder import Exported, Written, check_out_dir, default_out_dir, staged
from probe.file.exports.stream import Source

__all__ = ["export", "ROUTES", "Route", "Exported", "default_out_dir"]



@dataclass(frozen=True)
class Route:
    """Where an export is written from: its module and class (made with the source and the
    ``options`` it takes), the packages it needs installed, and whether it can write a file
    that holds no key (the bookkeeping alone)."""

    module: str
    name: str
    needs: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    without_keys: bool = False


# looked up by the name in to=; a new format is one module and one line here
ROUTES = {
    "npy": Route("probe.file.exports.npy", "NpyExport", without_keys=True),
    "parquet": Route("probe.file.exports.parquet", "ParquetExport", ("pyarrow",)),
    "mat": Route("probe.file.exports.mat", "MatExport", ("scipy",)),
    "saelens": Route("probe.file.exports.saelens", "SaelensExport", ("pyarrow", "datasets"),
                     options=("seed", "names", "chosen")),
    "speculators": Route("probe.file.exports.speculators", "SpeculatorsExport",
                         ("datasets", "safetensors", "transformers"), options=("aux",)),
}


def export(file: str | Path, to: str, *, keys: Sequence[str] | None = None,
           out_dir: str | Path | None = None, seed: int | None = 0,
           names: Mapping[str, str] | None = None, overwrite: bool = False,
           memory_mb: float = 256, aux: Sequence[int] | None = None) -> Exported:
    """Write the keys of a finished probe file in the format of ``to``, into ``out_dir``.

    Args:
        file: the probe file.
        to: npy | parquet | mat | saelens | speculators.
        keys: "<layer>/<kind>" or "<layer>" (its every kind); None: every stored key (saelens:
            every key with a vector per token).
        out_dir: the folder to write (default ``<file stem>_export`` beside the file); it is
            written beside and renamed into place once complete.
        seed: saelens: seeds the shuffle of the contexts; None keeps the file's order.
        names: saelens: column names by layer or key (the hook names a trainer expects).
        overwrite: replace an ``out_dir`` that is not empty.
        memory_mb: MiB of rows held at once.
        aux: speculators: the auxiliary layer ids (id i: the output of block i - 1); None:
            EAGLE-3's [2, L // 2, L - 3].

    Raises:
        ConfigError: an unknown route or key, a key the route cannot write, a bad value.
        DataError: no such file, or not a probe file.
        OutputError: a partial file, an ``out_dir`` that is not empty, or one that cannot be
            written.
    """
    route = _route(to)
    if names is not None and not isinstance(names, Mapping):
        raise ConfigError(f"names={names!r} is not a mapping; pass names={{layer: name, ...}}")
    if names and "names" not in route.options:
        named = [name for name, other in ROUTES.items() if "names" in other.options]
        raise ConfigError(f"names= names the columns of to={'|'.join(named)}, not of to={to}; "
                          "leave it out")
    if not memory_mb > 0:
        raise ConfigError(f"memory_mb={memory_mb} must be more than 0 (MiB of rows at once)")
    if keys is not None and not len(keys):
        raise ConfigError("keys=[] names no key; leave keys out for every stored key")
    with Source(file, keys) as source:
        out_dir = Path(out_dir) if out_dir is not None else default_out_dir(source.path)
        check_out_dir(out_dir, source=source.path, overwrite=overwrite)
        options = {"seed": seed, "names": dict(names or {}), "chosen": keys is not None,
                   "aux": None if aux is None else [int(i) for i in aux]}
        writer = _prepare(to, route, source, options)
        with staged(out_dir, source=source.path, overwrite=overwrite) as folder:
            written = writer.write(folder, int(memory_mb * 2**20))
        # compact rows are written decoded: say how the file held them, and what was lost
        stored = [f"{key}: stored as {said}" for key in source.keys
                  if (said := source.file.stored_as(key)) is not None]
    files = [Written(out_dir / path, rows) for path, rows in written]
    return Exported(to, out_dir, files, notes=list(getattr(writer, "notes", [])),
                    stored=stored)


def _route(to: str | None) -> Route:
    if to not in ROUTES:
        raise ConfigError(f"to={to!r} is not an export; choose one of {', '.join(ROUTES)} "
                          "(to=npy, for instance)")
    return ROUTES[str(to)]


def _prepare(to: str, route: Route, source: Source, options: dict):
    # every check a route makes happens here, before a folder exists
    for module in route.needs:
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"to={to} needs {module}: pip install 'probe[export]'") from None
    if not source.keys and not route.without_keys:
        raise ConfigError(f"{str(source.path)!r} holds no <layer>/<kind> to export to={to}")
    made = getattr(importlib.import_module(route.module), route.name)
    return made(source, **{name: options[name] for name in route.options})
