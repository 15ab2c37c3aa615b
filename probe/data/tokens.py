"""Pre-tokenized corpora: ``dataset=tokens dataset.path=ids.jsonl``, stored as a text run is.

Sparse-autoencoder and interpretability pipelines keep their corpora as token ids; turning them
back into text would need a tokenizer that round-trips exactly. Two layouts are read:

- a jsonl or parquet file whose ``column`` (default ``input_ids``) holds one list of integer
  ids per document (read by Hugging Face ``datasets``), with an optional ``label_column``;
- a flat ``.npy`` of ids with ``offsets`` naming an ``.npy`` of N + 1 document boundaries
  (document i is ``ids[offsets[i]:offsets[i+1]]``), memory-mapped, so a corpus larger than
  memory reads as it is needed.

Every id is fed as it is (no special tokens are added); ``max_length`` truncates longer
documents (how many is logged and recorded in the file).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.text.feed import TextFeed
from probe.errors import ConfigError, DataError

__all__ = ["TokenIds"]

log = logging.getLogger(__name__)

_READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_SCAN_IDS = 1 << 24  # ids read at a time when checking them against the vocabulary


class TokenIds(Dataset):
    """Documents of token ids: item i is ``{"input_ids", "keep", "target", "document"}``, as
    TextFeed reads them.

    Example::

        data = TokenIds(path="ids.npy", offsets="offsets.npy", max_length=128)
        data[0]["input_ids"]        # (L,) int64, the first document's ids

    Raises:
        DataError: a path that does not exist, a file of another kind, offsets that do not
            bound the ids.
        ConfigError: a column that is not in the file or does not hold integer lists.
    """

    feed = TextFeed()
    packing = False

    def __init__(self, path: str, column: str = "input_ids", offsets: str | None = None,
                 label_column: str | None = None, max_length: int | None = None):
        if max_length is not None and int(max_length) < 1:
            raise ConfigError(f"dataset.max_length={max_length} must be at least 1, or null")
        self.path, self.max_length = Path(str(path)).expanduser(), max_length
        if not self.path.is_file():
            raise DataError(f"dataset.path={str(path)!r}: no such file; pass a .jsonl or "
                            ".parquet file of id lists, or a .npy of ids with dataset.offsets")
        self.label_column = None if label_column is None else str(label_column)
        if self.path.suffix == ".npy":
            self._ids, self._offsets = _flat(self.path, offsets)
            if self.label_column is not None:
                raise ConfigError("dataset.label_column needs a jsonl or parquet file; a .npy "
                                  "of ids has no columns")
            self.labels = None
        else:
            self._ids, self._offsets, self.labels = _lists(self.path, str(column),
                                                           self.label_column)
        lengths = np.diff(self._offsets)
        if (lengths == 0).any():
            first = int(np.flatnonzero(lengths == 0)[0])
            raise DataError(f"dataset.path={str(path)!r}: document {first} has no ids")
        self.truncated = int((lengths > max_length).sum()) if max_length is not None else 0
        if self.truncated:
            log.info("%d of %d documents are longer than dataset.max_length=%d ids and were "
                     "truncated", self.truncated, len(lengths), max_length)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} documents")
        start, stop = int(self._offsets[index]), int(self._offsets[index + 1])
        if self.max_length is not None:
            stop = min(stop, start + int(self.max_length))
        ids = torch.from_numpy(np.array(self._ids[start:stop], dtype=np.int64))  # a copy: mmap
        target = -1 if self.labels is None else int(self.labels[index])
        return {"input_ids": ids, "keep": torch.ones(len(ids), dtype=torch.bool),
                "target": target, "document": None}

    def lengths(self, indices: list[int]) -> np.ndarray:
        lengths = np.diff(self._offsets)[np.asarray(indices, dtype=np.int64)]
        return lengths if self.max_length is None else np.minimum(lengths, self.max_length)

    stored_lengths = lengths  # every id is stored

    def first_bad(self, indices: list[int]) -> str | None:
        return None  # every document of ids is read whole when the dataset opens

    def first_id_outside(self, vocabulary: int, indices: list[int]) -> tuple[int, int] | None:
        """Read a block of ids at a time (the corpus may be larger than memory); only the ids
        that a selected sample feeds count (max_length cuts the rest)."""
        selected = np.zeros(len(self), dtype=bool)
        selected[np.asarray(indices, dtype=np.int64)] = True
        for start in range(0, len(self._ids), _SCAN_IDS):
            block = np.asarray(self._ids[start:start + _SCAN_IDS])
            bad = np.flatnonzero((block < 0) | (block >= vocabulary))
            if not len(bad):
                continue
            documents = np.searchsorted(self._offsets, bad + start, side="right") - 1
            fed = selected[documents]
            if self.max_length is not None:
                fed &= bad + start < self._offsets[documents] + int(self.max_length)
            if fed.any():
                first = int(np.argmax(fed))
                return int(documents[first]), int(block[bad[first]])
        return None

    def describe(self) -> dict:
        return {"source": str(self.path), "max_length": -1 if self.max_length is None else
                int(self.max_length), "truncated_documents": self.truncated}

    def fingerprint(self) -> dict:
        """The file's size and a digest of its first and last MiB (a corpus may be large)."""
        size = self.path.stat().st_size
        with self.path.open("rb") as stream:
            head = stream.read(1 << 20)
            stream.seek(max(0, size - (1 << 20)))
            tail = stream.read()
        return {"token_file": f"{self.path.name}:{size}:"
                              f"{hashlib.sha256(head + tail).hexdigest()[:16]}"}


def _flat(path: Path, offsets: str | None) -> tuple[np.ndarray, np.ndarray]:
    if offsets is None:
        raise ConfigError(f"dataset.path={str(path)!r} is a flat .npy of ids: set "
                          "dataset.offsets=<an .npy of the N + 1 document boundaries>")
    bounds_path = Path(str(offsets)).expanduser()
    if not bounds_path.is_file():
        raise DataError(f"dataset.offsets={str(offsets)!r}: no such file")
    ids = np.load(path, mmap_mode="r")
    bounds = np.load(bounds_path).astype(np.int64)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise DataError(f"dataset.path={str(path)!r} holds {ids.dtype} of shape {ids.shape}; "
                        "it must be a flat array of integer ids")
    if (bounds.ndim != 1 or len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != len(ids)
            or (np.diff(bounds) < 0).any()):
        raise DataError(f"dataset.offsets={str(offsets)!r} does not bound the {len(ids)} ids: "
                        "it must rise from 0 to their number, one boundary per document and "
                        "one more")
    return ids, bounds


def _lists(path: Path, column: str, label_column: str | None):
    import datasets

    if path.suffix not in _READERS:
        kind = path.suffix or "a file without a suffix"
        raise DataError(f"dataset.path={str(path)!r}: cannot read {kind}; use .jsonl, "
                        ".parquet, or .npy with dataset.offsets")
    datasets.disable_progress_bars()
    rows = datasets.load_dataset(_READERS[path.suffix], data_files=[str(path)], split="train")
    for key, name in (("column", column), ("label_column", label_column)):
        if name is not None and name not in rows.column_names:
            raise ConfigError(f"dataset.{key}={name!r} is not a column of {str(path)!r}; it "
                              f"has {', '.join(rows.column_names)}")
    lists = rows[column]
    bad = next((n for n, row in enumerate(lists) if not isinstance(row, list)
                or not all(isinstance(v, int) for v in row)), None)
    if bad is not None:
        raise ConfigError(f"dataset.column={column!r}, row {bad} of {str(path)!r}: not a list "
                          "of integer ids")
    lengths = np.asarray([len(row) for row in lists], dtype=np.int64)
    ids = np.fromiter((v for row in lists for v in row), dtype=np.int64, count=int(lengths.sum()))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    labels = None
    if label_column is not None:
        labels = np.asarray(rows[label_column])
        if labels.dtype.kind not in "iub":
            raise ConfigError(f"dataset.label_column={label_column!r} holds {labels.dtype} "
                              "values; it must hold integer class numbers")
    return ids, bounds, labels
