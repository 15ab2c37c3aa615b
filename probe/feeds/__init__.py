"""Feeds: how one kind of data reaches the model, behind one interface (``Feed``).

A feed turns dataset items into batches, says how the run's rows are laid out (one per sample,
or, for batches of sequences, one per real position, with ``/offsets``), which bookkeeping
datasets it adds, and counts progress. The planner, the dry run, the store and the writer only
talk to a feed, so a new kind of data is a new feed, not a branch through them:

    probe.feeds.tensors   items are a tensor or (tensor, target): images, or any array
    probe.text.feed       token sequences for language models (dataset=text, dataset=tokens)
    probe.feeds.pairs     images with captions, for both towers of a two-tower model
    probe.audio.feed      sound through a checkpoint's feature extractor (dataset=audio)

A dataset names its feed in a ``feed`` attribute; ``feed_for`` falls back to the TensorFeed.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from probe.errors import DataError, ProbeError
from probe.format import DatasetSpec

log = logging.getLogger(__name__)

__all__ = ["Feed", "Batch", "Batching", "OpenSelection", "Selection", "feed_for",
           "batch_loader", "bad_sample", "leave_stop_signals_to_the_run", "LoadedItems",
           "loadable"]


@dataclass
class Batch:
    """One batch, as the runner sees it."""

    index: torch.Tensor  # (B,) int64: the dataset index of each sample
    target: torch.Tensor  # (B,) int64: the dataset's target, -1 where it has none
    inputs: Any  # what the model is called on: a tensor, or a dict of tensors (keywords)
    # for batches of sequences: (B, L) True at the positions whose rows are stored
    keep: torch.Tensor | None = None
    # where a sample is fed as several rows of the model's input (the windows of a long
    # recording, in order): (rows,) the sample (0..B-1) of each row, which inputs and keep
    # then have; None: a row per sample
    row_sample: torch.Tensor | None = None
    # bookkeeping per stored position (keep's True entries, in order), e.g. each token's id
    position_rows: dict[str, torch.Tensor] = field(default_factory=dict)
    # bookkeeping per sample, e.g. each sample's file
    sample_rows: dict[str, np.ndarray] = field(default_factory=dict)
    # dataset indices of samples left out by dataset.on_error=skip while making this batch
    skipped: list[int] = field(default_factory=list)
    # why a sample of it could not be loaded (made in a loader worker, raised by the feed's
    # loader in the run's own process, as one line)
    failure: str | None = None
    # whether this batch ends a group of batches whose rows are stored together, in dataset
    # order (probe.feeds.buckets); a batch in dataset order is a group of its own
    ends_group: bool = True

    def __len__(self) -> int:
        return len(self.index)

    @property
    def lengths(self) -> torch.Tensor | None:
        """(B,) stored positions of each sample, for batches of sequences."""
        return None if self.keep is None else self.keep.sum(1)

    def to(self, device: torch.device) -> Batch:
        """The model's inputs and the position mask on ``device``; bookkeeping stays."""
        inputs = ({k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs.to(device, non_blocking=True))
        keep = None if self.keep is None else self.keep.to(device, non_blocking=True)
        return replace(self, inputs=inputs, keep=keep)

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
class OpenSelection:
    """The samples a job takes from a dataset read as it comes, whose length is not known
    before its end: among the first ``limit`` (None: all), those of its shard, after the first
    ``start`` of them (a resumed run's committed rows)."""

    limit: int | None
    shard_index: int = 0
    shard_count: int = 1
    start: int = 0

    def __getitem__(self, rows: slice) -> OpenSelection:
        """``selection[n:]``: the same samples after the first n (``[:n]`` is not known)."""
        if not isinstance(rows, slice) or rows.step not in (None, 1) or rows.stop is not None:
            raise TypeError("an open selection can only be sliced as [n:]")
        return replace(self, start=self.start + (rows.start or 0))

    def __bool__(self) -> bool:
        return True

    def takes(self, sample: int) -> bool | None:
        """Whether sample ``sample`` (in reading order) is this job's; None past the limit."""
        if self.limit is not None and sample >= self.limit:
            return None
        return sample % self.shard_count == self.shard_index


# the samples a job takes, in order: dataset indices, or an open selection
Selection = list[int] | OpenSelection


class Feed(Protocol):
    """How one kind of data reaches the model (see the module's docstring)."""

    # what the data is, for a model family to check that it can read it: "tensors" (images,
    # any array), "text" (token sequences), "pairs" (images with captions), "audio"
    kind: str
    unit: str  # what the progress bar counts: "sample", "tok"
    # whether batches hold sequences with a mask of the positions whose rows count (keep), so
    # that an output with a token axis can give one row per position
    positions: bool
    hint: str  # what to check when the model fails on the dry run
    targets_hint: str  # how a dataset of this kind has targets (for objective=target)

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

    def bookkeeping(self, dataset: Dataset) -> dict[str, DatasetSpec]:
        """The datasets this kind of data adds beside the layers' (per sample, or with
        ``per_position``, per stored position), filled from each batch's ``sample_rows`` and
        ``position_rows``."""

    def attrs(self, dataset: Dataset) -> dict:
        """Root attrs that say how the data was read."""

    def count(self, batch: Batch) -> int:
        """Units of progress in a batch."""

    def units(self, dataset: Dataset, selection: Selection) -> int | None:
        """Units of progress in these samples (None: not known)."""

    def describe(self, batch: Batch) -> str:
        """One sample of the batch, in words, for an error message."""


def feed_for(dataset: Dataset) -> Feed:
    """The feed a dataset names in its ``feed`` attribute, or a TensorFeed."""
    own = getattr(dataset, "feed", None)
    if own is not None:
        return own
    from probe.feeds.tensors import TensorFeed

    return TensorFeed()


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
    return Batch(empty, empty, {}, keep=torch.zeros(0, 0, dtype=torch.bool),
                 skipped=skipped or [], failure=failure)


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
