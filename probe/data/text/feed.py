"""How token sequences reach a language model: the feed of ``dataset=text`` and
``dataset=tokens``.

Batches are right-padded, with an attention mask, so that position ids start at 0 for every
sample (GPT-2's absolute positions would shift under left padding); padding is never stored.
Rows are one per stored position of each sample (``keep``: its tokens, less the special ones
that ``exclude_special`` leaves out), recorded with the token's id (``/input_ids``) and its
position (``/positions``), and, for packed windows, its document (``/document``).

A dataset of token sequences (``Sequences``) gives items ``{"input_ids", "keep", "target",
"document"}`` (and ``"columns"``: values per token stored beside the ids, a conversation's
``/loss_mask`` and ``/role``, a story's ``/onset``; ``"sample_columns"``: values per sample, a
story window's ``/file``, which its ``bookkeeping()`` declares) and says how long its samples
are, so that batches can be bucketed by length.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Protocol

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from probe.data.buckets import plan_batches, planned_batches
from probe.data.feed import (
    IGNORED_TARGET,
    Batch,
    Batching,
    DataKind,
    Feed,
    LoadedItems,
    ModelLimits,
    loadable,
)
from probe.data.layouts import Positions
from probe.data.selection import OpenSelection, Selection
from probe.data.text.stream import stream_items
from probe.errors import ConfigError, DataError
from probe.file.format import DOCUMENT, INPUT_IDS, POSITIONS, DatasetSpec

__all__ = ["TextFeed", "Sequences"]

log = logging.getLogger(__name__)


class Sequences(Protocol):
    """A dataset of token sequences, as TextFeed reads it (probe.data.text.corpus,
    probe.data.tokens, probe.data.text.chat, probe.data.text.words).

    Two members are optional: ``length_key``, the key that bounds a sample's tokens (default
    ``max_length``: what a message tells the user to set), and ``bookkeeping() -> {name:
    DatasetSpec}``, its datasets of one row per sample, filled from the items'
    ``sample_columns``.
    """

    label_column: str | None  # where the targets come from; None: no targets
    max_length: int | None  # the most tokens a sample feeds the model; None: not bounded
    packing: bool  # samples are windows of several documents (then /document is stored)

    def __getitem__(self, index: int) -> dict: ...

    def lengths(self, indices: list[int]) -> np.ndarray:
        """How many tokens each sample feeds the model."""

    def stored_lengths(self, indices: list[int]) -> np.ndarray:
        """How many token rows each sample stores."""

    def describe(self) -> dict:
        """Root attrs that say how the sequences were made (tokenizer, max_length, ...)."""

    def first_id_outside(self, vocabulary: int, indices: list[int]) -> tuple[int, int] | None:
        """The first of these samples that feeds an id outside 0 .. vocabulary - 1, and that
        id; None where every id is inside."""

    def first_bad(self, indices: list[int]) -> str | None:
        """The line that says why the first of these samples that cannot be loaded cannot
        (its text is no text, its conversation cannot be rendered); None where all can."""


class TextFeed(Feed):
    """The feed of token sequences: see the module's docstring."""

    kind = DataKind.text
    unit = "tok"
    positions = True
    hint = "a dataset.max_length beyond the model's positions?"
    targets_hint = "dataset.label_column, a column of integer labels"

    def check_fits(self, dataset: Sequences, selection: Selection, limits: ModelLimits) -> None:
        """Every sample within the model's positions and its ids within its vocabulary (the
        lengths are known before the run, unless the corpus is read as it comes: then its
        max_length must be within the positions)."""
        positions, longest = limits.positions, dataset.max_length
        key = getattr(dataset, "length_key", "max_length")
        if isinstance(selection, OpenSelection):
            if positions is not None and (longest is None or longest > positions):
                raise ConfigError(
                    f"dataset.max_length={longest} is beyond the {positions} positions of "
                    f"{limits.model}, and a corpus read as it comes has no lengths before the "
                    f"run; set dataset.max_length={positions} (or less)")
            return
        if positions is not None and selection:
            lengths = dataset.lengths(selection)
            over = np.flatnonzero(lengths > positions)
            if len(over):
                sample = selection[int(over[0])]
                raise ConfigError(
                    f"dataset sample {sample} has {int(lengths[over[0]])} tokens, beyond the "
                    f"{positions} positions of {limits.model} ({len(over)} of {len(lengths)} "
                    f"are); set dataset.{key}={positions} (or less) to cut them")
        if limits.vocabulary is not None and selection:
            found = dataset.first_id_outside(limits.vocabulary, selection)
            if found is not None:
                raise ConfigError(
                    f"dataset sample {found[0]} holds token id {found[1]}, outside the "
                    f"vocabulary of {limits.model} (ids 0 to {limits.vocabulary - 1}); are the "
                    "ids from this model's tokenizer?")

    def check_loads(self, dataset: Sequences, selection: Selection, skip_bad: bool) -> None:
        """The samples are tokenized (rendered) before the run: the first that cannot be is
        one line now, not when its batch comes (unless such samples are left out)."""
        first_bad = getattr(dataset, "first_bad", None)  # a dataset of one's own may not say
        if skip_bad or first_bad is None or isinstance(selection, OpenSelection) or not selection:
            return
        said = first_bad(selection)
        if said is not None:
            raise DataError(said)

    def has_targets(self, dataset: Sequences, sample: int) -> bool:
        return dataset.label_column is not None

    def loader(self, dataset: Sequences, selection: Selection, batching: Batching):
        """Batches over ``selection``: in dataset order, or bucketed by length within groups
        (each batch says whether it ends its group; probe.data.buckets)."""
        if isinstance(selection, OpenSelection):
            yield from self._read_as_it_comes(dataset, selection, batching)
            return
        planned = plan_batches(dataset.lengths(selection), batching)
        collate = partial(self.collate, skip_bad=batching.skip_bad)
        yield from planned_batches(dataset, selection, planned, collate, batching)

    def _read_as_it_comes(self, dataset, selection: OpenSelection, batching: Batching):
        # a group of samples at a time, cut into batches as from a list
        group = batching.group if batching.group > 1 else batching.batch_size
        rows: list[tuple[int, dict]] = []
        for row in stream_items(dataset, selection):
            rows.append(row)
            if len(rows) == group:
                yield from self._batches_of(rows, batching)
                rows = []
        yield from self._batches_of(rows, batching)

    def _batches_of(self, rows: list[tuple[int, dict]], batching: Batching):
        lengths = np.asarray([len(item["input_ids"]) for _, item in rows], dtype=np.int64)
        for positions, ends_group in plan_batches(lengths, batching):
            batch = self.collate([rows[p] for p in positions])
            batch.ends_group = ends_group
            yield batch

    def dry_batches(self, dataset: Sequences, index: int) -> list[Batch]:
        """The sample alone, and again one position shorter (or, for a sample of one token,
        one longer with padding): a captured tensor whose second axis follows the length is a
        token layout; then both in one batch, the shorter padded, as the run's batches are (a
        model whose masks fail on padding says so before any file exists). Never longer than
        the sample, which may fill the model's positions."""
        row = LoadedItems(dataset, [index])[0]
        if isinstance(row[1], str):
            raise DataError(row[1])
        if len(row[1]["input_ids"]) < 2:
            return [self.collate([row]), self.collate([row], extra=1)]
        shorter = (row[0], _shorter(row[1]))
        return [self.collate([row]), self.collate([shorter]), self.collate([row, shorter])]

    def collate(self, rows: list[tuple[int, dict | str]], extra: int = 0,
                skip_bad: bool = False) -> Batch:
        rows, skipped, instead = loadable(rows, skip_bad)
        if instead is not None:
            return instead
        index = torch.tensor([i for i, _ in rows], dtype=torch.int64)
        items = [item for _, item in rows]
        ids = pad_sequence([item["input_ids"] for item in items], batch_first=True)
        length = ids.shape[1] + extra
        ids = nn.functional.pad(ids, (0, extra))  # padding ids are masked: any will do
        real = torch.zeros(ids.shape, dtype=torch.bool)
        keep = torch.zeros(ids.shape, dtype=torch.bool)
        for n, item in enumerate(items):
            real[n, :len(item["input_ids"])] = True
            keep[n, :len(item["keep"])] = item["keep"]
        positions = torch.arange(length).expand(len(items), length)
        rows = {INPUT_IDS: ids[keep].to(torch.int32), POSITIONS: positions[keep].to(torch.int32)}
        if items[0]["document"] is not None:
            rows[DOCUMENT] = torch.cat([item["document"][item["keep"]] for item in items])
        for name in items[0].get("columns", {}):  # a value per token (a conversation's roles)
            rows[name] = torch.cat([item["columns"][name][item["keep"]] for item in items])
        sample_rows = {name: np.array([item["sample_columns"][name] for item in items],
                                      dtype=object)  # strings (a story's file) as h5py wants
                       for name in items[0].get("sample_columns", {})}
        inputs = {"input_ids": ids, "attention_mask": real.long()}
        if items[0].get("labels") is not None:  # an encoder-decoder's target, padded as
            # transformers pads one (probe.families.hf_seq2seq reads it)
            inputs["labels"] = pad_sequence([torch.as_tensor(item["labels"]) for item in items],
                                            batch_first=True, padding_value=IGNORED_TARGET)
        return Batch(index, torch.tensor([item["target"] for item in items], dtype=torch.int64),
                     inputs,
                     layout=Positions(keep, rows, answer_fill=items[0].get("answer_fill", {})),
                     sample_rows=sample_rows, skipped=skipped)

    def stored_positions(self, dataset: Sequences, selection: Selection) -> np.ndarray | None:
        """The token rows each sample stores (None when read as it comes: not known before)."""
        if isinstance(selection, OpenSelection):
            return None
        return dataset.stored_lengths(selection)

    def longest(self, dataset: Sequences) -> int | None:
        return dataset.max_length

    def bookkeeping(self, dataset: Sequences) -> dict[str, DatasetSpec]:
        """The dataset's own per sample, where it has any (a story window's /file); each token
        row's id and position (and, for packed windows, its document) come with the batch's
        layout."""
        own = getattr(dataset, "bookkeeping", None)  # optional (see Sequences)
        return {} if own is None else own()

    def attrs(self, dataset: Sequences) -> dict:
        return dataset.describe()

    def count(self, batch: Batch) -> int:
        return int(batch.layout.lengths.sum())

    def units(self, dataset: Sequences, selection: Selection) -> int | None:
        if isinstance(selection, OpenSelection):
            return None
        return int(dataset.stored_lengths(selection).sum()) if selection else 0

    def describe(self, batch: Batch) -> str:
        return f"{batch.layout.length} tokens"


def _shorter(item: dict) -> dict:
    """A sample one token shorter: each of its values per token (its columns' too) cut."""
    return {key: _shorter(value) if isinstance(value, dict) else
            value[:-1] if isinstance(value, torch.Tensor) else value
            for key, value in item.items()}
