"""Feeds: how one kind of data reaches the model, behind one interface (``Feed``).

A feed turns dataset items into batches (``Batch``, each with its row layout:
probe.data.layouts), says what its data is (``kind``, which a model family checks), which
bookkeeping datasets it adds per sample, and counts progress. The plan, the dry run, the
store and the writer only talk to a feed, so a new kind of data is a new feed, not a branch
through them:

    probe.data.tensors      items are a tensor or (tensor, target): images, or any array
    probe.data.text.feed    token sequences for language models (dataset=text, dataset=tokens)
    probe.data.pairs        images with captions, for both towers of a two-tower model
    probe.data.audio.feed   sound through a checkpoint's feature extractor (dataset=audio)
    probe.data.video.feed   windows of video files through the model's processor (dataset=video)

A dataset names its feed in a ``feed`` attribute; ``probe.data.tensors.feed_for`` falls back to
the tensors feed.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from probe.data.layouts import SAMPLE_ROWS, RowLayout
from probe.data.selection import OpenSelection, Selection
from probe.errors import DataError, ProbeError
from probe.file.format import DatasetSpec

log = logging.getLogger(__name__)

__all__ = ["DataKind", "Feed", "Batch", "Batching", "ModelLimits", "batch_loader", "bad_sample",
           "leave_stop_signals_to_the_run", "LoadedItems", "loadable", "IGNORED_TARGET"]

# a target's padding in a batch's ``labels`` (an encoder-decoder's target), as transformers pads
# one: its losses skip it
IGNORED_TARGET = -100


class DataKind(Enum):
    """What a feed's data is, as a model family checks it (``Feed.kind``)."""

    tensors = "tensors"  # images, or any array a model takes as it is
    text = "text"  # token sequences
    pairs = "pairs"  # images with captions
    audio = "audio"  # sound
    video = "video"  # frames in time: windows of a video file


@dataclass
class Batch:
    """One batch, as the runner sees it."""

    index: torch.Tensor  # (B,) int64: the dataset index of each sample
    target: torch.Tensor  # (B,) int64: the dataset's target, -1 where it has none
    inputs: Any  # what the model is called on: a tensor, or a dict of tensors (keywords)
    # how outputs with a position axis become rows, and the bookkeeping per stored position
    layout: RowLayout = SAMPLE_ROWS
    # bookkeeping per sample, e.g. each sample's file
    sample_rows: dict[str, np.ndarray] = field(default_factory=dict)
    # dataset indices of samples left out by dataset.on_error=skip while making this batch
    skipped: list[int] = field(default_factory=list)
    # why a sample of it could not be loaded (made in a loader worker, raised by the feed's
    # loader in the run's own process, as one line)
    failure: str | None = None
    # whether this batch ends a group of batches whose rows are stored together, in dataset
    # order (probe.data.buckets); a batch in dataset order is a group of its own
    ends_group: bool = True

    def __len__(self) -> int:
        return len(self.index)

    def to(self, device: torch.device) -> Batch:
        """The model's inputs on ``device``; the layout and the bookkeeping stay (a layout
        moves what it reads to the device of the values it selects from)."""
        inputs = ({k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs.to(device, non_blocking=True))
        return replace(self, inputs=inputs)

    def pin_memory(self) -> Batch:
        # called by DataLoader(pin_memory=True) on each batch
        inputs = ({k: v.pin_memory() for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs.pin_memory())
        return replace(self, inputs=inputs)


_GROUP_BATCHES = 16  # batches per group: the rows a bucketed run holds before writing them


@dataclass(frozen=True)
class Batching:
    """How a run cuts its samples into batches."""

    batch_size: int
    batch_tokens: int | None = None  # a budget of padded positions per batch, instead
    bucket: bool = False  # sort each group's samples by length first
    num_workers: int = 0
    pin_memory: bool = False
    skip_bad: bool = False  # dataset.on_error=skip: leave out samples that cannot be loaded

    @property
    def group(self) -> int:
        """Samples per group; 1 when batches are made one at a time in dataset order."""
        if not self.bucket and self.batch_tokens is None:
            return 1
        return _GROUP_BATCHES * self.batch_size


@dataclass(frozen=True)
class ModelLimits:
    """What inputs a model can take at most (its family knows): None where it has no limit."""

    positions: int | None = None  # sequence positions (learned absolute position embeddings)
    vocabulary: int | None = None  # token ids run from 0 to vocabulary - 1
    model: str = "the model"  # its name, for a message


class Feed(Protocol):
    """How one kind of data reaches the model (see the module's docstring). A feed may derive
    from this class for the defaults it gives."""

    kind: DataKind  # what the data is, for a model family to check that it can read it
    unit: str  # what the progress bar counts: "sample", "tok"
    # whether batches hold sequences of different lengths, which batches can be bucketed by
    # and cut by a budget of padded positions (batch_tokens)
    positions: bool
    hint: str  # what to check when the model fails on the dry run
    targets_hint: str  # how a dataset of this kind has targets (for objective=target)

    def for_model(self, output_lengths: Callable[[torch.Tensor], torch.Tensor] | None
                  ) -> Feed:
        """The feed for a model whose outputs have ``output_lengths(real input lengths)``
        real positions (the model family's own length function; None where outputs keep the
        input's positions): itself, for a kind of data whose rows do not depend on it."""
        return self

    def check_fits(self, dataset: Dataset, selection: Selection, limits: ModelLimits) -> None:
        """Refuse samples that the model cannot take (a document longer than its positions,
        a token id outside its vocabulary) before any is computed: the whole selection where
        it is known, else what the dataset's options allow.

        Raises:
            ConfigError: naming the first such sample and the option to set.
        """

    def check_loads(self, dataset: Dataset, selection: Selection, skip_bad: bool) -> None:
        """Refuse, before any is computed, a sample that the feed can tell cannot be loaded
        (a conversation the chat template cannot render), unless such samples are left out
        (``skip_bad``); a feed that cannot tell without loading every sample checks nothing.

        Raises:
            DataError: naming the first such sample.
        """

    def has_targets(self, dataset: Dataset, sample: int) -> bool:
        """Whether the dataset's samples have targets (stored as /target), as ``sample``, one
        that loads, shows."""

    def loader(self, dataset: Dataset, selection: Selection,
               batching: Batching) -> Iterable[Batch]:
        """The batches over ``selection``; each says whether it ends its group."""

    def dry_batches(self, dataset: Dataset, index: int) -> list[Batch]:
        """The dry run's batches, of sample ``index`` alone (sequences: two of different
        lengths, so that an output whose axis follows the length shows it)."""

    def stored_positions(self, dataset: Dataset, selection: Selection) -> np.ndarray | None:
        """How many positions each selected sample stores; None where that is not known before
        the run (an open selection) or the batches hold no sequences."""
        return None

    def longest(self, dataset: Dataset) -> int | None:
        """The most positions a sample of the dataset feeds the model (its sequences'
        ``max_length``), where samples vary in length and the dataset bounds them; None
        otherwise."""
        return None

    def bookkeeping(self, dataset: Dataset) -> dict[str, DatasetSpec]:
        """The datasets of one row per sample this kind of data adds beside the layers',
        filled from each batch's ``sample_rows`` (the layout adds those per position)."""
        return {}

    def attrs(self, dataset: Dataset) -> dict:
        """Root attrs that say how the data was read."""

    def count(self, batch: Batch) -> int:
        """Units of progress in a batch: its samples, unless the feed counts otherwise."""
        return len(batch)

    def units(self, dataset: Dataset, selection: Selection) -> int | None:
        """Units of progress in these samples (None: not known)."""
        return None if isinstance(selection, OpenSelection) else len(selection)

    def describe(self, batch: Batch) -> str:
        """One sample of the batch, in words, for an error message."""


def batch_loader(rows: Dataset, collate, batch_size: int = 1, num_workers: int = 0,
                 pin_memory: bool = False, batch_sampler=None) -> Iterable[Batch]:
    """The batches of a DataLoader over ``rows`` in order (or in ``batch_sampler``'s
    batches), whose workers leave stop signals to the run; a batch's ``failure`` is raised
    here as a DataError."""
    sizing = ({"batch_sampler": batch_sampler} if batch_sampler is not None else
              {"batch_size": batch_size, "shuffle": False})
    loader = DataLoader(rows, num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory,
                        persistent_workers=False, worker_init_fn=leave_stop_signals_to_the_run,
                        **sizing)
    return _raising(loader)


def _raising(loader: DataLoader) -> Iterable[Batch]:
    for batch in loader:
        if batch.failure is not None:
            raise DataError(batch.failure)
        yield batch


class LoadedItems(Dataset):
    """A dataset whose items raise DataError for a bad sample (one line naming it), seen
    through ``indices`` as (dataset index, item) or (dataset index, that line): what a feed's
    collate takes, in the run's process or a loader worker."""

    def __init__(self, dataset, indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        index = self.indices[i]
        try:
            return index, self.dataset[index]
        except DataError as err:  # its own line, naming the sample
            return index, str(err)


def loadable(rows: list[tuple[int, Any]], skip_bad: bool
             ) -> tuple[list[tuple[int, Any]], list[int], Batch | None]:
    """The rows of LoadedItems that loaded, the dataset indices of those left out, and the
    batch to give instead of collating, if any: the first failure's (raised by the loader,
    in the run's process) unless ``skip_bad``, or an empty one when every row was left out."""
    bad = [(index, said) for index, said in rows if isinstance(said, str)]
    if bad and not skip_bad:
        return [], [], _empty_batch(failure=bad[0][1])
    for _, said in bad:
        log.warning("left out (dataset.on_error=skip): %s", said.split(";")[0])
    good = [row for row in rows if not isinstance(row[1], str)]
    skipped = [index for index, _ in bad]
    return good, skipped, (None if good else _empty_batch(skipped=skipped))


def _empty_batch(failure: str | None = None, skipped: list[int] | None = None) -> Batch:
    empty = torch.zeros(0, dtype=torch.int64)
    return Batch(empty, empty, {}, skipped=skipped or [], failure=failure)


def bad_sample(index: int, err: BaseException, where: str = "") -> str:
    """The line that says sample ``index`` (of ``where``: its file, its line) failed; a
    ProbeError that the dataset raised is its own line already."""
    text = str(err).strip()
    if isinstance(err, ProbeError):  # the dataset's own line, as it wrote it
        return text
    said = f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
    return (f"dataset sample {index}{f' ({where})' if where else ''} cannot be loaded ({said});"
            " fix or remove it, or set dataset.on_error=skip to leave such samples out")


def leave_stop_signals_to_the_run(worker_id: int) -> None:
    """A DataLoader worker ignores SIGINT and SIGTERM: Ctrl-C and SLURM's SIGTERM reach the
    whole process group, and a worker that died of them would make the loader raise before
    the run could stop at a batch boundary and commit; the run stops its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
