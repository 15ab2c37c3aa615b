"""``to=parquet``: ``D/<file stem>.parquet``, a row per stored row, written in row groups.

Columns: the row's bookkeeping, then a column per key, named by the key (``layer4/output``),
holding the row flattened as a fixed-size list (its field metadata ``shape`` and ``dims`` say
how to fold it back). Bookkeeping of rows per sample: ``index`` and ``target`` (where the file
has targets); of rows per token: ``sample`` (its sample's row of /index), that sample's
``index`` and ``target``, and the token's own ``input_ids``, ``positions``, ``document``,
``generated``, ``modality`` where the file has them. The sample's text (``file``, ``caption``,
``completion``, ``transcript``: a string a sample) follows its ``index``, as a string column
(dictionary-encoded, so the text of a sample with many token rows is stored once a page).
Readable by pyarrow, pandas, polars and DuckDB.

The key columns are not compressed (activations barely shrink, and readers decode them faster
as they are); the bookkeeping columns are (snappy). Each row group is one block of the export's
budget, so memory stays at one block.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from probe.errors import ConfigError
from probe.file.exports.stream import Source
from probe.file.format import (
    DECODER_INPUT_IDS,
    DECODER_OFFSETS,
    DOCUMENT,
    GENERATED,
    INDEX,
    INPUT_IDS,
    OFFSETS,
    POSITIONS,
    TARGET,
    Attr,
)

__all__ = ["ParquetExport", "TOKEN_COLUMNS"]

# a token row's own bookkeeping, where the file has it
TOKEN_COLUMNS = (INPUT_IDS, POSITIONS, DOCUMENT, GENERATED, "modality")
# those of an encoder-decoder's decoder rows, by the dataset that bounds them
BOUNDED_COLUMNS = {DECODER_OFFSETS: (DECODER_INPUT_IDS,)}


class ParquetExport:
    """The keys of ``source`` as one table; they must have the same rows.

    Raises:
        ConfigError: keys with different numbers of rows (per sample and per token).
    """

    def __init__(self, source: Source):
        self.source = source
        counts = {key: source.rows(key) for key in source.keys}
        if len(set(counts.values())) > 1:
            listed = ", ".join(f"{k} ({n})" for k, n in counts.items())
            raise ConfigError(f"to=parquet writes a table of rows, and these keys have "
                              f"different numbers of rows: {listed}; export them apart, each "
                              "with keys=[...] and its own out_dir")
        self.num_rows = next(iter(counts.values()))
        first = source.keys[0]
        self.per_token = source.per_token(first)
        self.per_sample = not self.per_token and self.num_rows == source.rows(INDEX)
        # an encoder-decoder's encoder rows and its decoder's are tokens of two texts
        self.bounds = source.bounds(first) if self.per_token else None
        others = [key for key in source.keys
                  if self.per_token and source.bounds(key) != self.bounds]
        if others:
            raise ConfigError(f"to=parquet writes a table of rows, and {first} has a row per "
                              f"token of one text (/{self.bounds}), {others[0]} of another "
                              f"(/{source.bounds(others[0])}); export them apart, each with "
                              "keys=[...] and its own out_dir")
        columns = TOKEN_COLUMNS if self.bounds == OFFSETS else BOUNDED_COLUMNS.get(self.bounds, ())
        self.token_columns = [name for name in columns if self.per_token and name in source
                              and source.rows(name) == self.num_rows]
        # a string a sample, where the rows have a sample each
        self.text_columns = [name for name in source.bookkeeping if source.is_text(name)
                             and (self.per_token or self.per_sample)
                             and source.rows(name) == source.rows(INDEX)]

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(f"{self.source.path.stem}.parquet")
        schema = self._schema(pa)
        bookkeeping = [f.name for f in schema if f.name not in self.source.keys]
        offsets = self.source.offsets(self.bounds) if self.per_token else None
        with pq.ParquetWriter(folder / path, schema, use_dictionary=bookkeeping,
                              compression={n: "snappy" if n in bookkeeping else "none"
                                           for n in schema.names},
                              write_statistics=bookkeeping) as writer:
            # a third of the budget a row group: the writer holds it twice more while it
            # encodes it
            for start, stop in self.source.aligned_blocks(
                    [*self.source.keys, *self.token_columns], budget // 3):
                columns = self._bookkeeping(start, stop, offsets)
                for key in self.source.keys:
                    columns[key] = _flat(pa, np.asarray(self.source[key][start:stop]))
                writer.write_table(pa.Table.from_pydict(columns, schema=schema),
                                   row_group_size=stop - start)
        return [(path, self.num_rows)]

    def _schema(self, pa):
        fields = []
        if self.per_token:
            fields.append(pa.field("sample", pa.int64()))
        if self.per_token or self.per_sample:
            fields.append(pa.field(INDEX, pa.int64()))
            if TARGET in self.source:
                fields.append(pa.field(TARGET, pa.int64()))
        for name in self.text_columns:
            fields.append(pa.field(name, pa.string()))
        for name in self.token_columns:
            fields.append(pa.field(name, pa.from_numpy_dtype(self.source.dtype(name))))
        for key in self.source.keys:
            dataset = self.source[key]
            shape = tuple(dataset.shape[1:])
            value = pa.from_numpy_dtype(self.source.dtype(key))
            dims = [str(d) for d in dataset.attrs.get(Attr.DIMS, [])]
            fields.append(pa.field(key, pa.list_(value, int(np.prod(shape, dtype=np.int64)))
                                   if shape else value,
                                   metadata={"shape": json.dumps(shape), "dims": json.dumps(dims)}))
        return pa.schema(fields, metadata={"probe_file": self.source.path.name,
                                           "config": str(self.source.file.attrs.get(
                                               Attr.CONFIG, ""))})

    def _bookkeeping(self, start: int, stop: int, offsets: np.ndarray | None) -> dict:
        source, columns = self.source, {}
        if self.per_token:
            samples = np.searchsorted(offsets, np.arange(start, stop), side="right") - 1
            columns["sample"] = samples
            first, last = int(samples[0]), int(samples[-1]) + 1
            for name in (INDEX, TARGET, *self.text_columns):
                if name in source:
                    columns[name] = _values(source, name, first, last)[samples - first]
        elif self.per_sample:
            for name in (INDEX, TARGET, *self.text_columns):
                if name in source:
                    columns[name] = _values(source, name, start, stop)
        for name in self.token_columns:
            columns[name] = source[name][start:stop]
        return columns


def _values(source: Source, name: str, start: int, stop: int) -> np.ndarray:
    dataset = source[name]
    return np.asarray((dataset.asstr() if source.is_text(name) else dataset)[start:stop])


def _flat(pa, rows: np.ndarray):
    # (B, *S) as B fixed-size lists of prod(S) values, without a copy of the values
    if rows.ndim == 1:
        return pa.array(rows)
    values = pa.array(np.ascontiguousarray(rows).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, int(np.prod(rows.shape[1:])))
