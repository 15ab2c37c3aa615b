"""Conversations as datasets of token sequences: ``dataset=chat dataset.path=chats.jsonl``.

Each row holds a conversation, ``messages: [{role, content}]`` or ShareGPT's ``conversations:
[{from, value}]``, read with Hugging Face ``datasets`` as ``dataset=text`` reads its files (or
from the Hub by name and split). Each is rendered with the tokenizer's own chat template (or
``chat_template``, a file), tokenized and truncated to ``max_length``
(probe.data.text.turns); its token rows are stored as for text, with ``/loss_mask`` (the
assistant's tokens) and ``/role`` beside ``/input_ids``. ``rows=assistant`` stores the
assistant's rows alone.

A conversation that cannot be rendered (no assistant turn, an unknown role, a template that
fails on it) is one line, or left out and recorded with ``dataset.on_error=skip``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.feed import bad_sample
from probe.data.text.corpus import (  # how dataset=text reads files, columns, tokenizers
    _column,
    _columns,
    _digest,
    _files,
    _fingerprint,
    _load,
    _required,
    _tokenizer,
)
from probe.data.text.feed import TextFeed
from probe.data.text.turns import ROLES, Turns, messages_of, render, with_system
from probe.errors import ConfigError, DataError
from probe.file.format import LOSS_MASK, ROLE

__all__ = ["ChatDataset"]

log = logging.getLogger(__name__)

_SHAPES = ("messages", "conversations")  # the columns a conversation is found in, in order


class ChatDataset(Dataset):
    """Rendered conversations: item i is ``{"input_ids", "keep", "target", "document",
    "columns": {"loss_mask", "role"}}`` (see the module's docstring).

    Raises:
        DataError: a path that does not exist, a file kind ``datasets`` cannot read.
        ConfigError: no conversation column, a tokenizer without a chat template, an
            unknown ``rows``.
    """

    feed = TextFeed()
    label_column = None
    packing = False

    def __init__(self, path: str | None = None, name: str | None = None, split: str = "train",
                 column: str | None = None, max_length: int = 2048,
                 tokenizer: str | None = None, chat_template: str | None = None,
                 system_prompt: str | None = None, rows: str = "all", generate: int = 0):
        if int(max_length) < 1:
            raise ConfigError(f"dataset.max_length={max_length} must be at least 1")
        if rows not in ("all", "assistant"):
            raise ConfigError(f"dataset.rows={rows!r} is unknown; use all (every token's row) "
                              "or assistant (the assistant's tokens alone)")
        self.max_length, self.rows_kept, self.system_prompt = int(max_length), rows, system_prompt
        # generate.max_new_tokens, as the config group interpolates it: above 0, each
        # conversation is its prompt, cut before its last turn (the assistant's, to answer anew)
        self.generating = int(generate) > 0
        self.files = _files(path) if path is not None else []
        self.source = str(path) if path is not None else f"{name}:{split}"
        self.tokenizer_name = _required(tokenizer, "tokenizer", "the model's name or folder")
        self.tokenizer = _tokenizer(self.tokenizer_name)
        self.template = _template(chat_template)
        if self.template is None and not self.tokenizer.chat_template:
            raise ConfigError(f"the tokenizer {self.tokenizer_name!r} has no chat template; "
                              "set dataset.chat_template=<a .jinja file>, or use a chat model's "
                              "tokenizer")
        self.table = _load(self.files, name, split, streaming=False)
        columns = _columns(self.table)
        if column is None:
            column = next((c for c in _SHAPES if c in columns), _SHAPES[0])
        self.column = _column(columns, column, "column", self.source)
        self.truncated: set[int] = set()
        self.ways: set[str] = set()  # how the loss masks were found (said in the log)
        self._turns: dict[int, Turns | str] = {}  # conversation -> rendered, or why not

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} conversations")
        turns = self.turns([index])[0]
        if isinstance(turns, str):
            raise DataError(turns)
        keep = turns.loss_mask if self.rows_kept == "assistant" else np.ones(len(turns.ids),
                                                                           dtype=bool)
        return {"input_ids": torch.from_numpy(turns.ids), "keep": torch.from_numpy(keep),
                "target": -1, "document": None,
                "columns": {LOSS_MASK: torch.from_numpy(turns.loss_mask),
                            ROLE: torch.from_numpy(turns.role)},
                # what a generated token's are: the assistant's
                "answer_fill": {LOSS_MASK: True, ROLE: ROLES.index("assistant")}}

    def turns(self, indices: list[int]) -> list[Turns | str]:
        """Each conversation rendered and truncated, or the line that says why it cannot be."""
        for index in dict.fromkeys(indices):
            if index not in self._turns:
                self._turns[index] = self._render(index)
        return [self._turns[i] for i in indices]

    def _render(self, index: int) -> Turns | str:
        try:
            messages = with_system(messages_of(self.table[index][self.column]),
                                   self.system_prompt)
            if self.generating:
                messages = _prompt_of(messages)
            turns = render(self.tokenizer, messages, self.template, prompt=self.generating)
        except ValueError as err:
            return bad_sample(index, DataError(f"conversation {index} of {self.source}: {err}; "
                                               "fix or remove it, or set dataset.on_error=skip "
                                               "to leave such conversations out"))
        if turns.way not in self.ways:
            self.ways.add(turns.way)
            log.info("dataset=chat: the assistant's tokens found by %s", turns.way)
        if len(turns.ids) > self.max_length and self.generating:  # its end is the prompt's
            return bad_sample(index, DataError(
                f"conversation {index} of {self.source}: its prompt has {len(turns.ids)} "
                f"tokens, beyond dataset.max_length={self.max_length}, and cut it would lose "
                "the generation prompt; raise max_length, or set dataset.on_error=skip to leave "
                "such conversations out"))
        if len(turns.ids) > self.max_length:
            self.truncated.add(index)
            cut = slice(0, self.max_length)
            turns = Turns(turns.ids[cut], turns.loss_mask[cut], turns.role[cut], turns.way)
        return turns

    def first_bad(self, indices: list[int]) -> str | None:
        return next((t for t in self.turns(indices) if isinstance(t, str)), None)

    def first_id_outside(self, vocabulary: int, indices: list[int]) -> tuple[int, int] | None:
        if len(self.tokenizer) <= vocabulary:
            return None
        for index, turns in zip(indices, self.turns(indices), strict=True):
            if isinstance(turns, Turns):
                outside = turns.ids[(turns.ids < 0) | (turns.ids >= vocabulary)]
                if len(outside):
                    return index, int(outside[0])
        return None

    def lengths(self, indices: list[int]) -> np.ndarray:
        """How many tokens each conversation feeds the model (0 for one that cannot be read)."""
        return np.asarray([len(t.ids) if isinstance(t, Turns) else 0
                           for t in self.turns(indices)], dtype=np.int64)

    def stored_lengths(self, indices: list[int]) -> np.ndarray:
        """How many token rows each conversation stores."""
        found = self.turns(indices)
        if self.truncated:
            log.info("%d of %d conversations are longer than dataset.max_length=%d tokens and "
                     "were truncated", len(self.truncated & set(indices)), len(indices),
                     self.max_length)
        return np.asarray([0 if isinstance(t, str) else
                           int(t.loss_mask.sum()) if self.rows_kept == "assistant" else
                           len(t.ids) for t in found], dtype=np.int64)

    def describe(self) -> dict:
        """Root attrs that say how the conversations became token sequences."""
        return {"tokenizer": self.tokenizer_name, "max_length": self.max_length,
                "rows": self.rows_kept, "loss_mask": "; ".join(sorted(self.ways)),
                "truncated_documents": len(self.truncated)}

    def fingerprint(self) -> dict:
        """The files (names and sizes) or the Hub dataset, the tokenizer and the template."""
        return {**_fingerprint(self.files, self.source, self.table, self.tokenizer),
                "chat_template": _digest(self.template or self.tokenizer.chat_template or "")}


def _prompt_of(messages: list[dict]) -> list[dict]:
    """A conversation cut before its last turn, which must be the assistant's (its answer, to
    be generated anew).

    Raises:
        ValueError: it ends with another turn.
    """
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"it ends with a {messages[-1]['role']} turn, and generating answers "
                         "each conversation's last turn, the assistant's, anew; end each with "
                         "the assistant's turn to regenerate, or leave generate.max_new_tokens "
                         "out")
    return messages[:-1]


def _template(path: str | None) -> str | None:
    """The text of a chat template file (None: the tokenizer's own)."""
    if path is None:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"dataset.chat_template={path!r}: no such file; give a .jinja file "
                          "that holds a chat template")
    return file.read_text()

