"""Word-timed stories as windows of tokens: ``dataset=text dataset.path=story.tsv``.

Brain-encoding data sets (Narratives, LeBel et al.'s podcasts) give each story as a table of
words with the time each was spoken: a ``.csv`` or ``.tsv`` file, a header row, a row per word,
in order, with an onset (and usually an offset) in seconds. ``dataset.path`` is such a table or
a folder of them (one story each, read in the order of their paths).

Which paths are stories (``story_for``, which ``TextDataset`` asks before it reads a corpus):
a ``.tsv`` file, or a ``.csv`` file whose header has the onset column (``onset_column``), or a
folder of such files. Every other path is an ordinary corpus, read as before; setting a key of
stories (``context_tokens``, ``context_stride``, other column names) for one is an error.

A story's words are joined with single spaces and that text is tokenized by the model's own
tokenizer (so the tokens are the text's, a GPT-2-style byte-level BPE giving each word after the
first its leading space); each token takes the onset of the word its first character lies in
(a special token that the tokenizer adds takes its neighbour's word).

The language model reads a story in windows of ``context_tokens`` tokens that start every
``context_stride`` tokens (0, stride, 2 * stride, ... until one reaches the story's end). Each
window is a sample; it stores the rows of the tokens it owns, those that no earlier window
holds, so that each token's row is computed with the most left context the windows give it
(between context_tokens - context_stride + 1 and context_tokens tokens, fewer at the story's
start), and a story's rows are its tokens, in order, once each. Beside ``/input_ids`` each row
records ``/onset``, its word's onset; each window records its story's ``/file``.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.text.corpus import (  # how dataset=text names its keys and loads tokenizers
    _BUILDERS,
    TextDataset,
    _digest,
    _fingerprint,
    _required,
    _tokenizer,
    add_sibling,
)
from probe.data.text.feed import TextFeed
from probe.errors import ConfigError, DataError
from probe.file.format import FILE, ONSET, Attr, DatasetSpec

__all__ = ["WordStories", "story_for"]

log = logging.getLogger(__name__)

_DELIMITERS = {".csv": ",", ".tsv": "\t"}
_STORY_KEYS = ("context_tokens", "context_stride", "onset_column", "offset_column")
_CORPUS_KEYS = ("label_column", "packing", "streaming")  # what a story has no use for
_WORD_COLUMNS = ("word",)  # where the words are when dataset.column keeps its default, text


def story_for(arguments: dict) -> WordStories | None:
    """The stories that ``TextDataset``'s arguments (all of them, defaults included) name, or
    None where they name an ordinary corpus (see the module's docstring).

    Raises:
        ConfigError: a key of stories set for a path that is no word table (naming its
            columns, where it is a table); a key of corpora set for a story.
        DataError: a folder that mixes word tables with other files.
    """
    defaults = _defaults()
    path, onset = arguments.get("path"), str(arguments["onset_column"])
    asked = next((key for key in _STORY_KEYS if arguments[key] != defaults[key]), None)
    if path is not None and not Path(str(path)).expanduser().exists():
        return None  # the corpus says that it does not exist
    tables = _story_tables(path, onset) if path is not None else None
    if tables is None:
        if asked is not None:
            raise ConfigError(_not_a_story(asked, arguments[asked], path, onset))
        return None
    extra = next((key for key in _CORPUS_KEYS if arguments[key] != defaults[key]), None)
    if extra is not None:
        raise ConfigError(f"dataset.{extra}={arguments[extra]!r} does not apply to a word-timed "
                          f"story (dataset.path={str(path)!r}: a table with an onset column); "
                          "leave it out")
    return WordStories(**{key: arguments[key] for key in inspect.signature(
        WordStories.__init__).parameters if key != "self"})


@dataclass(frozen=True)
class _Story:
    """One story, tokenized: its file (relative to the dataset's folder), its token ids and
    each token's word's onset, and how many words it has."""

    file: str
    ids: np.ndarray  # (T,) int64
    onsets: np.ndarray  # (T,) float64
    words: int


class WordStories(Dataset):
    """Windows of word-timed stories: item i is ``{"input_ids", "keep", "target", "document",
    "columns": {"onset"}, "sample_columns": {"file"}}`` (see the module's docstring).

    Example::

        data = WordStories(path="story.tsv", tokenizer="gpt2", context_tokens=128,
                           context_stride=16)
        data[1]["keep"]      # (128,) bool: the last 16 tokens, which window 0 does not hold

    Raises:
        DataError: a path that does not exist or holds no tables; a table without words, a
            word without a valid onset, onsets that go backwards, an offset before its onset.
        ConfigError: a column that is not in a table; a window or stride that cannot be; a
            tokenizer without character offsets (a slow one).
    """

    feed = TextFeed()
    label_column = None
    packing = False
    length_key = "context_tokens"  # what to set where a window is beyond the model's positions

    def __init__(self, path: str, column: str = "text", max_length: int = 128,
                 tokenizer: str | None = None, exclude_special: bool = False,
                 onset_column: str = "onset", offset_column: str = "offset",
                 context_tokens: int | None = None, context_stride: int | None = None):
        self.context_tokens, self.context_stride = _window(max_length, context_tokens,
                                                           context_stride)
        self.max_length = self.context_tokens  # the most tokens a window feeds the model
        self.exclude_special = bool(exclude_special)
        self.source = str(path)
        self.files, root = _files(path)
        self.tokenizer_name = _required(tokenizer, "tokenizer", "the model's name or folder")
        self.tokenizer = _tokenizer(self.tokenizer_name)
        if not self.tokenizer.is_fast:
            raise ConfigError(f"dataset.tokenizer={self.tokenizer_name!r} is a slow tokenizer, "
                              "which gives no character offsets to find each token's word; "
                              "use a fast one (the folder's tokenizer.json)")
        self.special = np.asarray(sorted(self.tokenizer.all_special_ids), dtype=np.int64)
        self.keys = {"column": str(column), "onset_column": str(onset_column),
                     "offset_column": str(offset_column)}
        self.columns: dict[str, str] = {}  # the columns found (in the stories that have them)
        self.stories = [self._story(file, os.path.relpath(file, root)) for file in self.files]
        self._windows = _windows_of([len(s.ids) for s in self.stories], self.context_tokens,
                                    self.context_stride)
        owned = self._owned(np.arange(len(self)))
        log.info("dataset=text: %d stories, %d words, %d tokens, in %d windows of %d tokens "
                 "every %d", len(self.stories), sum(s.words for s in self.stories),
                 int(owned.sum()), len(self), self.context_tokens, self.context_stride)

    def _story(self, file: Path, name: str) -> _Story:
        words, onsets, columns = _table(file, self.keys)
        self.columns.update({k: v for k, v in columns.items() if v or k not in self.columns})
        text, ends = _joined(words)
        found = self.tokenizer(text, add_special_tokens=True, return_offsets_mapping=True,
                               verbose=False)  # a story is longer than the model: no warning
        spans = np.asarray(found["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        word = _token_words(spans, ends)
        return _Story(name, np.asarray(found["input_ids"], dtype=np.int64), onsets[word],
                      len(words))

    def __len__(self) -> int:
        return len(self._windows)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        story, start, stop, own = (int(v) for v in self._windows[index])
        ids = self.stories[story].ids[start:stop]
        keep = np.arange(start, stop) >= own
        if self.exclude_special:
            keep &= ~np.isin(ids, self.special)
        return {"input_ids": torch.from_numpy(ids.copy()), "keep": torch.from_numpy(keep),
                "target": -1, "document": None,
                "columns": {ONSET: torch.from_numpy(self.stories[story].onsets[start:stop])},
                "sample_columns": {FILE: self.stories[story].file}}

    def _owned(self, indices: np.ndarray) -> np.ndarray:
        # how many rows each window stores: the tokens it owns (less the special ones)
        story, _, stop, own = self._windows[indices].T
        if not self.exclude_special:
            return stop - own
        return np.asarray([int((~np.isin(self.stories[s].ids[a:b], self.special)).sum())
                           for s, a, b in zip(story, own, stop, strict=True)], dtype=np.int64)

    def lengths(self, indices: list[int]) -> np.ndarray:
        """How many tokens each window feeds the model."""
        windows = self._windows[np.asarray(indices, dtype=np.int64)]
        return windows[:, 2] - windows[:, 1]

    def stored_lengths(self, indices: list[int]) -> np.ndarray:
        """How many token rows each window stores: those it owns."""
        return self._owned(np.asarray(indices, dtype=np.int64))

    def first_bad(self, indices: list[int]) -> str | None:
        return None  # every story is read and tokenized when the dataset opens

    def first_id_outside(self, vocabulary: int, indices: list[int]) -> tuple[int, int] | None:
        if len(self.tokenizer) <= vocabulary:
            return None
        for index in indices:
            story, start, stop, _ = (int(v) for v in self._windows[index])
            ids = self.stories[story].ids[start:stop]
            outside = ids[(ids < 0) | (ids >= vocabulary)]
            if len(outside):
                return index, int(outside[0])
        return None

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        """Per window: its story's file (``/file``, from each item's ``sample_columns``)."""
        return {FILE: DatasetSpec((), "str", {Attr.DIMS: ["sample"]}, compressible=False)}

    def describe(self) -> dict:
        """Root attrs that say how the stories became windows of tokens."""
        return {"tokenizer": self.tokenizer_name, "context_tokens": self.context_tokens,
                "context_stride": self.context_stride, "word_column": self.columns["column"],
                "onset_column": self.columns["onset_column"],
                "offset_column": self.columns["offset_column"], "packing": False,
                "exclude_special": self.exclude_special, "stories": len(self.stories),
                "words": sum(s.words for s in self.stories)}

    def fingerprint(self) -> dict:
        """The files and the tokenizer as a text corpus's, the bytes of each story (an onset
        changed in place keeps its file's size), and how they were cut into windows."""
        root = os.path.commonpath([str(f.parent) for f in self.files])
        contents = sorted(f"{os.path.relpath(f, root)}:{hashlib.sha256(f.read_bytes()).hexdigest()}"
                          for f in self.files)
        windows = (f"context_tokens={self.context_tokens} context_stride={self.context_stride} "
                   + " ".join(f"{k}={v}" for k, v in sorted(self.columns.items())))
        return {**_fingerprint(self.files, self.source, None, self.tokenizer),
                "stories": _digest("\n".join(contents)), "story_windows": windows}


def _defaults() -> dict:
    return {name: p.default for name, p in
            inspect.signature(TextDataset.__init__).parameters.items()}


def _tables(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in _DELIMITERS and p.is_file())


def _header(file: Path) -> list[str]:
    with file.open(newline="", encoding="utf-8-sig") as stream:
        row = next(csv.reader(stream, delimiter=_DELIMITERS[file.suffix]), None)
    return [] if row is None else [name.strip() for name in row]


def _is_story(file: Path, onset: str) -> bool:
    # dataset=text reads .tsv files as word tables alone; a .csv is one where it has the column
    return file.suffix == ".tsv" or onset in _header(file)


def _story_tables(path: str, onset: str) -> list[Path] | None:
    """The word tables ``path`` names, or None where it names no story (the rule of the
    module's docstring)."""
    root = Path(str(path)).expanduser()
    if root.is_file():
        return [root] if root.suffix in _DELIMITERS and _is_story(root, onset) else None
    tables = _tables(root)
    stories = [t for t in tables if _is_story(t, onset)]
    if not stories:
        return None
    others = [t for t in tables if t not in stories] + sorted(
        p for p in root.rglob("*") if p.suffix in _BUILDERS and p.suffix not in _DELIMITERS)
    if others:
        raise DataError(f"dataset.path={str(path)!r} mixes word tables (with an onset column "
                        f"{onset!r}, or .tsv: {stories[0].relative_to(root)}) and other files "
                        f"({others[0].relative_to(root)}); keep one kind per folder")
    return stories


def _not_a_story(key: str, value, path, onset: str) -> str:
    said = f"dataset.{key}={value!r} is for word-timed stories"
    root = None if path is None else Path(str(path)).expanduser()
    tables = [] if root is None else [root] if root.suffix == ".csv" else (
        _tables(root) if root.is_dir() else [])
    if tables:
        columns = _header(tables[0]) or ["no columns"]
        return (f"{said}, and {str(tables[0])!r} has no onset column {onset!r} (it has "
                f"{', '.join(columns)}); set dataset.onset_column=<its column of onsets in "
                "seconds>, or leave the keys of stories out to read it as a csv corpus")
    where = "no dataset.path" if path is None else f"dataset.path={str(path)!r}"
    return (f"{said}, and {where} is no word table; give a .csv or .tsv table of words with an "
            f"onset column, or leave dataset.{key} out")


def _window(max_length, context_tokens, context_stride) -> tuple[int, int]:
    tokens = int(max_length if context_tokens is None else context_tokens)
    if tokens < 1:
        key = "max_length" if context_tokens is None else "context_tokens"
        raise ConfigError(f"dataset.{key}={tokens} must be at least 1 (the tokens of a window)")
    stride = max(1, tokens // 2) if context_stride is None else int(context_stride)
    if not 1 <= stride <= tokens:
        raise ConfigError(f"dataset.context_stride={stride} must be between 1 and "
                          f"dataset.context_tokens={tokens}: windows that start further apart "
                          "than their length would leave tokens out")
    return tokens, stride


def _files(path) -> tuple[list[Path], Path]:
    """The tables of ``path`` and the folder their ``/file`` names are relative to."""
    root = Path(str(path)).expanduser()
    if root.is_file():
        return [root], root.parent
    tables = _tables(root) if root.is_dir() else []
    if not tables:
        raise DataError(f"dataset.path={str(path)!r}: no such file, nor a folder of .csv or "
                        ".tsv tables of words")
    return tables, root


def _table(file: Path, keys: dict) -> tuple[list[str], np.ndarray, dict]:
    """A story's words and their onsets (checked: every one a time, in order, before its
    offset), and the columns they were found in.

    Raises:
        ConfigError: a column that the table does not have.
        DataError: no words, a word or onset missing, onsets going backwards, an offset before
            its onset, a row with more or fewer fields than the header.
    """
    with file.open(newline="", encoding="utf-8-sig") as stream:
        reader = csv.reader(stream, delimiter=_DELIMITERS[file.suffix])
        header = [name.strip() for name in next(reader, [])]
        if not header:
            raise DataError(f"dataset.path: {str(file)!r} is empty; give each story a header "
                            "and a row per word, or remove the file")
        columns = _columns(file, header, keys)
        where = {k: header.index(v) for k, v in columns.items() if v}
        words, onsets, before = [], [], None  # before: the previous onset, and its line
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # a blank line holds no word
            line = f"{str(file)!r}, line {reader.line_num}"
            if len(row) != len(header):
                raise DataError(f"{line} has {len(row)} fields and the header {len(header)}; "
                                "quote a word that holds the delimiter")
            word = row[where["column"]].strip()
            if not word:
                raise DataError(f"{line}: its {columns['column']!r} is empty; give the word, "
                                "or remove the row")
            onset = _seconds(row[where["onset_column"]], columns["onset_column"], line)
            if before is not None and onset < before[0]:
                raise DataError(f"{line}: onset {onset:g} is before the previous word's "
                                f"{before[0]:g} ({before[1]}); the words must be in the order "
                                "they were spoken (sort the table by onset)")
            if "offset_column" in where:
                offset = _seconds(row[where["offset_column"]], columns["offset_column"], line)
                if offset < onset:
                    raise DataError(f"{line}: offset {offset:g} is before its onset {onset:g}; "
                                    "fix the word's times")
            words.append(word)
            onsets.append(onset)
            before = (onset, f"line {reader.line_num}")
    if not words:
        raise DataError(f"dataset.path: {str(file)!r} holds no words (a header alone); give "
                        "each story a row per word, or remove the file")
    return words, np.asarray(onsets, dtype=np.float64), columns


def _columns(file: Path, header: list[str], keys: dict) -> dict:
    """The word, onset and offset columns of a table (offset: "" where it has none and none
    was asked for)."""
    has = ", ".join(header)
    found = {}
    for key in ("column", "onset_column", "offset_column"):
        name = keys[key]
        if key == "column" and name not in header and name == "text":  # the default
            name = next((c for c in _WORD_COLUMNS if c in header), name)
        if name not in header:
            if key == "offset_column" and name == "offset":  # optional, unless named
                found[key] = ""
                continue
            what = {"column": "its words", "onset_column": "each word's onset in seconds",
                    "offset_column": "each word's offset in seconds"}[key]
            raise ConfigError(f"dataset.{key}={name!r} is not a column of {str(file)!r}; it has "
                              f"{has}; set dataset.{key}=<the column of {what}>")
        found[key] = name
    return found


def _seconds(value: str, column: str, line: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        said = "missing" if not value.strip() or seconds != seconds else f"{value!r}"
        raise DataError(f"{line}: its {column} is {said}, not a time in seconds; give every "
                        "word its time, or remove the row")
    return seconds


def _joined(words: list[str]) -> tuple[str, np.ndarray]:
    """The story's text, its words joined by single spaces, and where each word ends in it
    (the index after its last character)."""
    lengths = np.asarray([len(w) for w in words], dtype=np.int64)
    ends = np.cumsum(lengths + 1) - 1
    return " ".join(words), ends


def _token_words(spans: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The word of each token (its (start, stop) characters): the first word that ends after
    the token's first character (a space before a word is that word's, as a byte-level BPE
    token holds it). A token of no characters (a special token the tokenizer added) takes the
    word of the next token that has some, or of the last one."""
    word = np.minimum(np.searchsorted(ends, spans[:, 0], side="right"), len(ends) - 1)
    real = np.flatnonzero(spans[:, 1] > spans[:, 0])
    if len(real) == 0:
        return np.zeros(len(spans), dtype=np.int64)
    empty = np.flatnonzero(spans[:, 1] <= spans[:, 0])
    word[empty] = word[real[np.minimum(np.searchsorted(real, empty), len(real) - 1)]]
    return word


def _windows_of(lengths: list[int], tokens: int, stride: int) -> np.ndarray:
    """(story, start, stop, own) of every window, story after story: a window covers tokens
    start .. stop - 1 and stores own .. stop - 1, those no earlier window holds."""
    rows = []
    for story, length in enumerate(lengths):
        count = 1 if length <= tokens else -(-(length - tokens) // stride) + 1
        starts = np.arange(count, dtype=np.int64) * stride
        stops = np.minimum(starts + tokens, length)
        owns = np.where(starts == 0, 0, starts + tokens - stride)
        rows.append(np.stack([np.full(count, story), starts, stops, owns], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.int64)


add_sibling(story_for)  # TextDataset hands it every path, and reads those it declines
