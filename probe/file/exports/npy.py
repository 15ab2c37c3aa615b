"""``to=npy``: a ``.npy`` file per dataset, at the dataset's HDF5 path.

    D/index.npy  D/target.npy  (every dataset at the file's root: offsets, input_ids, ...)
    D/<layer>/<kind>.npy       each key asked for
    D/attrs.json               the root's attrs (the run's config) and each file's dataset attrs

Each loads with ``np.load(path, mmap_mode="r")``. bfloat16 rows are written as float32 (the
values exactly); text as fixed-width unicode (``<U``, as wide as its longest string).

The header comes from ``np.lib.format.open_memmap``, which also sizes the file; the rows are
then written block by block through the file, not through the map: pages written through a map
count as the process's resident memory until it is unmapped, and the export should stay as
small as one block.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from probe.file.exports.stream import Source, json_attrs

__all__ = ["NpyExport"]


class NpyExport:
    """Every bookkeeping dataset and each key of ``source``, a ``.npy`` file each."""

    def __init__(self, source: Source):
        self.source = source
        self.names = [*source.bookkeeping, *source.keys]

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int | None]]:
        written = []
        for name in self.names:
            path = Path(f"{name}.npy")
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            written.append((path, self._write(name, folder / path, budget)))
        attrs = {"/": json_attrs(self.source.file.attrs),
                 **{name: json_attrs(self.source[name].attrs) for name in self.names}}
        (folder / "attrs.json").write_text(json.dumps(attrs, indent=1, default=str))
        return [*written, (Path("attrs.json"), None)]

    def _write(self, name: str, path: Path, budget: int) -> int:
        source = self.source
        dataset = source[name]
        dtype = _text_dtype(source, name, budget) if source.is_text(name) else source.dtype(name)
        header = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=dataset.shape)
        offset = header.offset
        del header  # the map is closed untouched: the file holds the header and its full size
        with path.open("r+b") as stream:
            stream.seek(offset)
            for _, block in source.blocks(name, budget):
                stream.write(np.ascontiguousarray(block, dtype=dtype).data)
                del block  # before the next block is read
        return len(dataset)


def _text_dtype(source: Source, name: str, budget: int) -> np.dtype:
    # a first pass for the longest string: numpy keeps text at a fixed width
    width = max((max(map(len, block), default=0) for _, block in source.blocks(name, budget)),
                default=0)
    return np.dtype(f"<U{max(1, width)}")
