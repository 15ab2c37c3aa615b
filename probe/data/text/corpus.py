"""Text corpora as datasets of token sequences: ``dataset=text dataset.path=docs.jsonl``.

Files are read with Hugging Face ``datasets`` (a .txt file holds one document per line; .jsonl,
.json, .csv and .parquet hold a text column; a folder holds files of one of these kinds) or a
dataset is taken from the Hub by name and split. Documents are tokenized by the model's own
tokenizer (``transformers.AutoTokenizer``), before any compute, so that a run knows its exact
number of rows.

Two ways to cut a corpus into samples:

- one document per sample (default), truncated to ``max_length`` tokens (how many were is
  logged and recorded in the file);
- ``packing=true``: documents joined with the tokenizer's end-of-text token, cut into windows
  of ``max_length`` tokens (the last window may be shorter): no padding, nothing truncated.
  Each window is a sample; ``/document`` records which document each token came from.

``streaming=true`` reads the corpus as a stream instead (probe.data.text.stream): for corpora larger
than memory or the disk's cache.

A word-timed story (a .tsv table of words, or a .csv one with an onset column:
probe.data.text.words) is no corpus: ``TextDataset(...)`` gives its sibling ``WordStories`` for
it, and takes its keys (``onset_column``, ``offset_column``, ``context_tokens``,
``context_stride``) for that alone.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.feed import bad_sample
from probe.data.selection import OpenSelection
from probe.data.text.feed import TextFeed
from probe.data.text.stream import pack, stream_items
from probe.errors import ConfigError, DataError

__all__ = ["TextDataset", "add_sibling"]

log = logging.getLogger(__name__)

# file suffix -> the `datasets` builder that reads it
_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv",
             ".parquet": "parquet"}
_TOKENIZE_BATCH = 1000  # documents per call of the (fast, Rust) tokenizer


class TextDataset(Dataset):
    """Tokenized documents: item i is ``{"input_ids", "keep", "target", "document"}``.

    Example::

        data = TextDataset(path="docs.jsonl", tokenizer="gpt2", max_length=128)
        item = data[0]      # input_ids (L,) int64, keep (L,) bool: positions whose rows are
                            # stored; target: int (-1 without label_column)

    With ``streaming`` the dataset has no length and is read as a stream (probe.data.text.stream);
    ``data[i]`` then reads the stream up to sample i.

    Raises:
        DataError: a path that does not exist, a file kind ``datasets`` cannot read.
        ConfigError: a column that is not in the data, labels that are not integers, a
            tokenizer that cannot be loaded, packing without an end-of-text token, a key of
            word-timed stories for a path that is none.
    """

    feed = TextFeed()

    def __new__(cls, *args, **kwargs):
        # a path that a sibling reads (a word-timed story: probe.data.text.words) gives the
        # sibling's dataset: dataset=text names one factory, and neither the feed nor the core
        # tells them apart. Unpickling (a loader's worker) calls this with no arguments.
        if args or kwargs:
            bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
            for sibling in _SIBLINGS:
                found = sibling(arguments)
                if found is not None:
                    return found
        return super().__new__(cls)

    def __init__(self, path: str | None = None, name: str | None = None, split: str = "train",
                 column: str = "text", label_column: str | None = None, max_length: int = 128,
                 tokenizer: str | None = None, packing: bool = False,
                 exclude_special: bool = False, streaming: bool = False,
                 onset_column: str = "onset", offset_column: str = "offset",
                 context_tokens: int | None = None, context_stride: int | None = None,
                 target_column: str | None = None):
        if int(max_length) < 1:
            raise ConfigError(f"dataset.max_length={max_length} must be at least 1")
        self.max_length, self.packing = int(max_length), bool(packing)
        self.exclude_special, self.streaming = bool(exclude_special), bool(streaming)
        self.files = _files(path) if path is not None else []
        self.source = str(path) if path is not None else f"{name}:{split}"
        self.tokenizer_name = _required(tokenizer, "tokenizer", "the model's name or folder")
        self.tokenizer = _tokenizer(self.tokenizer_name)
        self.rows = _load(self.files, name, split, self.streaming)
        columns = _columns(self.rows)
        self.column = _column(columns, column, "column", self.source)
        self.label_column = (None if label_column is None else
                             _column(columns, str(label_column), "label_column", self.source))
        if self.packing and self.label_column is not None:
            raise ConfigError("dataset.label_column with dataset.packing=true: a window holds "
                              "several documents, so it has no one label; use packing=false")
        # an encoder-decoder's target (probe.families.hf_seq2seq): its decoder reads it,
        # teacher-forced, and stores a row per target token
        self.target_column = (None if target_column is None else
                              _column(columns, str(target_column), "target_column", self.source))
        if self.target_column is not None and (self.packing or self.streaming):
            key = "packing" if self.packing else "streaming"
            raise ConfigError(f"dataset.target_column with dataset.{key}=true: a target goes "
                              f"with its own text, read whole and at once; set {key}=false")
        self._targets: dict[int, np.ndarray] = {}  # document -> its target's token ids
        self.labels = None
        if self.label_column is not None and not self.streaming:
            self.labels = _labels(np.asarray(self.rows[self.label_column]), self.label_column)
        self.special = np.asarray(sorted(self.tokenizer.all_special_ids), dtype=np.int64)
        self.truncated: set[int] = set()
        self.bad: dict[int, str] = {}  # document -> why it cannot be read (its text is no text)
        self._ids: dict[int, np.ndarray] = {}  # document -> token ids, tokenized on demand
        self._packed: list[dict] | None = None
        if self.packing and not self.streaming:
            self._packed = [item for _, item in pack(self)]

    def __len__(self) -> int:
        if self.streaming:
            raise TypeError("a streamed dataset has no length before it is read to its end")
        return len(self._packed) if self.packing else len(self.rows)

    def __getitem__(self, index: int) -> dict:
        if self.streaming:  # read up to it (the dry run's first sample, a cheap read)
            found = next((item for i, item in stream_items(self, OpenSelection(index + 1))
                          if i == index), None)
            if found is None:
                raise IndexError(f"index {index} is past the end of the stream")
            return found
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        if self.packing:
            return self._packed[index]
        target = -1 if self.labels is None else int(self.labels[index])
        ids = self.tokens([index])[0]
        if index in self.bad:
            raise DataError(self.bad[index])
        item = self.item(ids, target, None)
        if self.target_column is not None:
            item["labels"] = self.target_ids(index)
        return item

    def target_ids(self, index: int) -> np.ndarray:
        """The token ids of document ``index``'s target (``target_column``), as the tokenizer
        makes a target (``text_target``: its end token, a translation model's target
        vocabulary), truncated to max_length.

        Raises:
            DataError: a target that is not a string (null, a number), naming it.
        """
        if index not in self._targets:
            text = self.rows[index][self.target_column]
            if not isinstance(text, str) or not text:
                raise DataError(bad_sample(index, ValueError(
                    f"its {self.target_column!r} is {text!r}, not a target text"),
                    f"row {index} of {self.source}"))
            ids = self.tokenizer(text_target=[text], add_special_tokens=True, truncation=True,
                                 max_length=self.max_length)["input_ids"][0]
            self._targets[index] = np.asarray(ids, dtype=np.int64)
        return self._targets[index]

    def item(self, ids: np.ndarray, target: int, document: np.ndarray | None) -> dict:
        """A sample from its token ids: which positions are stored, its target, documents."""
        keep = ~np.isin(ids, self.special) if self.exclude_special else np.ones(len(ids), bool)
        return {"input_ids": torch.from_numpy(ids.astype(np.int64)),
                "keep": torch.from_numpy(keep), "target": target,
                "document": None if document is None else torch.from_numpy(document)}

    def tokenize(self, texts: list[str], indices: list[int]) -> list[np.ndarray]:
        """The token ids of documents, special tokens included, truncated to max_length (and
        their ``indices`` noted in ``truncated``).

        Raises:
            DataError: a document whose text is not a string (null, a number), naming it.
        """
        for text, index in zip(texts, indices, strict=True):
            if not isinstance(text, str):
                raise DataError(self._not_text(index, text))
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        long = [n for n, row in enumerate(ids) if len(row) > self.max_length]
        if long:  # again with the tokenizer's own truncation, which keeps end tokens
            cut = self.tokenizer([texts[n] for n in long], add_special_tokens=True,
                                 truncation=True, max_length=self.max_length)["input_ids"]
            for n, row in zip(long, cut, strict=True):
                ids[n] = row
            self.truncated.update(indices[n] for n in long)
        return [np.asarray(row, dtype=np.int32) for row in ids]

    def tokens(self, indices: list[int]) -> list[np.ndarray]:
        """The token ids of documents ``indices``, tokenizing those not seen yet. A document
        whose text is not a string has no ids; loading it raises what ``bad`` says."""
        todo = [i for i in dict.fromkeys(indices) if i not in self._ids]
        for start in range(0, len(todo), _TOKENIZE_BATCH):
            batch = todo[start:start + _TOKENIZE_BATCH]
            texts = self.rows[batch][self.column]
            good = [(i, text) for i, text in zip(batch, texts, strict=True)
                    if isinstance(text, str)]
            for i, text in zip(batch, texts, strict=True):
                if not isinstance(text, str):
                    self.bad[i] = self._not_text(i, text)
                    self._ids[i] = np.zeros(0, dtype=np.int32)
            if good:
                ids = self.tokenize([t for _, t in good], [i for i, _ in good])
                self._ids.update(zip([i for i, _ in good], ids, strict=True))
        return [self._ids[i] for i in indices]

    def _not_text(self, index: int, value) -> str:
        return bad_sample(index, ValueError(f"its {self.column!r} is {value!r}, not text"),
                          f"row {index} of {self.source}")

    def separator(self) -> int:
        """The token that packing puts after each document.

        Raises:
            ConfigError: the tokenizer has no end-of-text (or separator) token.
        """
        for token in (self.tokenizer.eos_token_id, self.tokenizer.sep_token_id):
            if token is not None:
                return int(token)
        raise ConfigError(f"dataset.packing=true needs an end-of-text token, and the tokenizer "
                          f"{self.tokenizer_name!r} has none (no eos_token, no sep_token); use "
                          "packing=false")

    def first_id_outside(self, vocabulary: int, indices: list[int]) -> tuple[int, int] | None:
        """The model's own tokenizer gives ids inside its vocabulary, unless it has tokens
        the model does not (added tokens without resized embeddings): only then are the ids
        read."""
        if len(self.tokenizer) <= vocabulary:
            return None
        for index in indices:
            ids = (self._packed[index]["input_ids"].numpy() if self.packing
                   else self.tokens([index])[0])
            outside = ids[(ids < 0) | (ids >= vocabulary)]
            if len(outside):
                return index, int(outside[0])
        return None

    def first_bad(self, indices: list[int]) -> str | None:
        if self.packing:  # windows are made of the documents that could be read
            return None
        self.tokens(indices)
        return next((self.bad[i] for i in indices if i in self.bad), None)

    def lengths(self, indices: list[int]) -> np.ndarray:
        """How many tokens each of these samples feeds the model (special tokens included)."""
        if self.packing:
            return np.asarray([len(self._packed[i]["input_ids"]) for i in indices],
                              dtype=np.int64)
        return np.asarray([len(ids) for ids in self.tokens(indices)], dtype=np.int64)

    def stored_lengths(self, indices: list[int]) -> np.ndarray:
        """How many token rows each of these samples stores."""
        if self.packing:
            return np.asarray([int(self._packed[i]["keep"].sum()) for i in indices],
                              dtype=np.int64)
        windows = self.tokens(indices)
        if self.truncated:
            log.info("%d of %d documents are longer than dataset.max_length=%d tokens and "
                     "were truncated", len(self.truncated & set(indices)), len(indices),
                     self.max_length)
        if not self.exclude_special:
            return np.asarray([len(w) for w in windows], dtype=np.int64)
        return np.asarray([int((~np.isin(w, self.special)).sum()) for w in windows],
                          dtype=np.int64)

    def describe(self) -> dict:
        """Root attrs that say how the documents became token sequences."""
        return {"tokenizer": self.tokenizer_name, "max_length": self.max_length,
                "packing": self.packing, "exclude_special": self.exclude_special,
                "streaming": self.streaming, "truncated_documents": len(self.truncated)}

    def fingerprint(self) -> dict:
        """The files (relative paths and sizes) or the Hub dataset, and the tokenizer."""
        return _fingerprint(self.files, self.source, self.rows, self.tokenizer)


# hydra and inspect read the keys from __init__, not from __new__'s (*args, **kwargs)
TextDataset.__signature__ = inspect.signature(TextDataset.__init__).replace(
    parameters=list(inspect.signature(TextDataset.__init__).parameters.values())[1:])

# readers of dataset=text's paths besides the corpus: each takes TextDataset's arguments (its
# defaults filled in) and gives its own dataset, or None where the path is not its kind. The
# package's __init__ imports them, so that they are here before any TextDataset is made.
_SIBLINGS: list[Callable[[dict], Dataset | None]] = []


def add_sibling(reader: Callable[[dict], Dataset | None]) -> None:
    """Let ``reader`` take the paths of its kind from TextDataset (see ``_SIBLINGS``)."""
    if reader not in _SIBLINGS:
        _SIBLINGS.append(reader)


def _fingerprint(files: list[Path], source: str, rows, tokenizer) -> dict:
    """What a corpus read by ``_load`` and tokenized by ``tokenizer`` is made of: its files
    (relative paths and sizes) or its Hub dataset, and the tokenizer's vocabulary."""
    if files:
        root = os.path.commonpath([str(f.parent) for f in files])
        lines = sorted(f"{os.path.relpath(f, root)}:{f.stat().st_size}" for f in files)
    else:
        lines = [source, str(getattr(rows, "_fingerprint", ""))]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else str(sorted(
        tokenizer.get_vocab().items()))
    return {"text_files": _digest("\n".join(lines)), "tokenizer": _digest(vocab)}


def _required(value, key: str, what: str) -> str:
    if value is None or str(value) == "":
        raise ConfigError(f"dataset.{key} is not set; set dataset.{key}=<{what}>")
    return str(value)


def _files(path: str) -> list[Path]:
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(f"dataset.path={path!r}: no such file or folder")
    files = sorted(p for p in root.rglob("*") if p.suffix in _BUILDERS) if root.is_dir() else [root]
    if not files:
        raise DataError(f"dataset.path={path!r} holds no {', '.join(_BUILDERS)} files")
    kinds = {_BUILDERS.get(f.suffix) for f in files}
    if None in kinds:
        raise DataError(f"dataset.path={path!r}: cannot read {files[0].suffix or 'files without a'}"
                        f" suffix; use {', '.join(_BUILDERS)}")
    if len(kinds) > 1:
        raise DataError(f"dataset.path={path!r} mixes kinds of files ({', '.join(sorted(kinds))}"
                        "); keep one kind per folder")
    return files


def _load(files: list[Path], name: str | None, split: str, streaming: bool):
    import datasets

    datasets.disable_progress_bars()
    # its own log line for a file it cannot parse would repeat the error probe reports
    datasets.utils.logging.set_verbosity(logging.CRITICAL)
    if files:
        builder = _BUILDERS[files[0].suffix]
        if not any(f.stat().st_size for f in files):
            raise DataError(f"dataset.path={_shown(files)}: holds no documents (empty)")
        try:
            rows = datasets.load_dataset(builder, data_files=[str(f) for f in files],
                                         split="train", streaming=streaming)
        except datasets.exceptions.DatasetGenerationError as err:
            cause = err.__cause__ or err
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
            raise DataError(f"dataset.path={_shown(files)} cannot be read as {builder} "
                            f"({first}); fix the file, or leave it out") from None
        if builder == "text":  # one document per line: blank lines are not documents
            rows = rows.filter(lambda row: bool(row["text"].strip()))
        return rows
    if name is None:
        raise ConfigError("dataset=text needs dataset.path (a file or folder) or dataset.name "
                          "(a Hugging Face dataset) with dataset.split")
    try:
        return datasets.load_dataset(str(name), split=str(split), streaming=streaming)
    except (FileNotFoundError, ConnectionError, OSError) as err:
        first = str(err).strip().splitlines()[0]
        raise DataError(f"dataset.name={name!r}, split={split!r}: cannot load it ({first}); "
                        "offline, only datasets already in the Hugging Face cache load") from None


def _shown(files: list[Path]) -> str:
    return repr(str(files[0])) + (f" (and {len(files) - 1} more files)" if len(files) > 1 else "")


def _columns(rows) -> list[str]:
    # a stream may not know its columns before its first row is read
    if rows.column_names is not None:
        return list(rows.column_names)
    first = next(iter(rows), None)
    return [] if first is None else list(first)


def _column(columns: list[str], column: str, key: str, source: str) -> str:
    if column not in columns:
        raise ConfigError(f"dataset.{key}={column!r} is not a column of {source}; it has "
                          f"{', '.join(columns)}")
    return column


def _labels(values: np.ndarray, column: str) -> np.ndarray:
    if values.dtype.kind not in "iub":
        raise ConfigError(f"dataset.label_column={column!r} holds {values.dtype} values; it must "
                          "hold integer class numbers")
    return values.astype(np.int64)


def _tokenizer(name: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"dataset.tokenizer={name!r} cannot be loaded ({first}); pass a Hub id "
                          "in the cache or a folder that save_pretrained wrote") from None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
