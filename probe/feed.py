"""Feeds: how one kind of data reaches the model.

A feed turns dataset items into batches, calls the model on a batch, builds the objective that
gradients differentiate, and counts progress. The runner and the planner only talk to a feed, so
a new kind of data is a new feed, not a branch through them:

    TensorFeed      items are a tensor or (tensor, target): images, or any array
    probe.text      tokenized documents for Hugging Face language models (TextFeed)

A dataset names its feed in a ``feed`` attribute; ``feed_for`` falls back to TensorFeed.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from probe.errors import ConfigError
from probe.objectives import make_objective, per_sample

__all__ = ["Batch", "Batching", "StreamSlice", "TensorFeed", "feed_for", "split_item",
           "batch_loader", "Objective"]


@dataclass
class Batch:
    """One batch, as the runner sees it."""

    index: torch.Tensor  # (B,) int64: the dataset index of each sample
    target: torch.Tensor  # (B,) int64: the dataset's target, -1 where it has none
    inputs: Any  # what the feed hands to the model: a tensor, or a dict of tensors
    # for batches of token sequences: (B, L) True at the positions whose rows are stored
    keep: torch.Tensor | None = None
    # for batches of token sequences: per stored position (keep's True entries, in order)
    token_rows: dict[str, torch.Tensor] = field(default_factory=dict)
    # whether this batch ends a window of batches whose rows are stored together, in dataset
    # order (probe.text.batching); a batch in dataset order is a window of its own
    window_end: bool = True

    def __len__(self) -> int:
        return len(self.index)

    @property
    def lengths(self) -> torch.Tensor | None:
        """(B,) stored positions of each sample, for token batches."""
        return None if self.keep is None else self.keep.sum(1)

    def to(self, device: torch.device) -> Batch:
        """The model's inputs and the token mask on ``device``; bookkeeping stays where it is."""
        inputs = ({k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs.to(device, non_blocking=True))
        keep = None if self.keep is None else self.keep.to(device, non_blocking=True)
        return replace(self, inputs=inputs, keep=keep)

    def pin_memory(self) -> Batch:
        # called by DataLoader(pin_memory=True) on each batch
        inputs = ({k: v.pin_memory() for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs.pin_memory())
        return replace(self, inputs=inputs)


Objective = Callable[[Any, Batch], torch.Tensor]  # (model output, batch) -> (B,) values

_WINDOW_BATCHES = 16  # batches per window: the rows a bucketed run holds before writing them


@dataclass(frozen=True)
class Batching:
    """How a run cuts its samples into batches."""

    batch_size: int
    batch_tokens: int | None = None  # a budget of padded positions per batch, instead
    bucket: bool = False  # sort each window's documents by length first
    num_workers: int = 0
    pin_memory: bool = False

    @property
    def window(self) -> int:
        """Samples per window; 1 when batches are made one at a time in dataset order."""
        if not self.bucket and self.batch_tokens is None:
            return 1
        return _WINDOW_BATCHES * self.batch_size


class TensorFeed:
    """Items are a tensor or a (tensor, int target, ...) tuple; a batch stacks the tensors and
    the model is called on the stack."""

    unit = "sample"  # what the progress bar counts
    token_rows = False  # batches hold no token sequences, so no rows per token are stored
    hint = "a dataset.image_size too small for it?"  # when the model fails on the dry run

    def has_targets(self, dataset: Dataset) -> bool:
        """Whether the dataset's items are (input, target) pairs rather than bare inputs."""
        return split_item(dataset[0])[1] is not None

    def loader(self, dataset: Dataset, indices: list[int], batching) -> Iterable[Batch]:
        """Batches of ``batching.batch_size`` over ``indices``, in order."""
        return batch_loader(_Rows(dataset, indices), self.collate, batching.batch_size,
                            batching.num_workers, batching.pin_memory)

    def dry_batches(self, dataset: Dataset, index: int) -> list[Batch]:
        """The batches of the dry run: sample ``index`` alone."""
        return [self.collate([_Rows(dataset, [index])[0]])]

    def collate(self, rows: list[tuple[int, torch.Tensor, int]]) -> Batch:
        index, inputs, target = zip(*rows, strict=True)
        return Batch(torch.tensor(index, dtype=torch.int64),
                     torch.tensor(target, dtype=torch.int64), torch.stack(inputs))

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        """The model's output for a batch on the device; with ``input_grad`` the autograd graph
        starts at the input itself."""
        return model(batch.inputs.requires_grad_(input_grad) if input_grad else batch.inputs)

    def objective(self, spec, model: nn.Module) -> tuple[Objective, str]:
        """``objective`` of the config as (output, batch) -> one value per sample."""
        function, name = make_objective(spec)
        return (lambda output, batch: per_sample(function, output, batch.target)), name

    def count(self, batch: Batch) -> int:
        """Units of progress in a batch."""
        return len(batch)

    def units(self, dataset: Dataset, indices: list[int]) -> int:
        """Units of progress in these samples."""
        return len(indices)

    def attrs(self, dataset: Dataset) -> dict:
        """Root attrs that say how the data was fed: the transform of an image dataset."""
        transform = getattr(dataset, "transform", None)
        if transform is None:
            return {}
        from probe.preprocess import describe_transform

        return {"transform": json.dumps(describe_transform(transform))}

    def describe(self, batch: Batch) -> str:
        """One sample of the batch, in words."""
        return f"shape {tuple(batch.inputs.shape[1:])}"


@dataclass(frozen=True)
class StreamSlice:
    """The samples a job takes from a stream: among the first ``limit`` (None: all), those of
    its shard, after the first ``start`` of them (a resumed run's committed rows)."""

    limit: int | None
    shard_index: int = 0
    shard_count: int = 1
    start: int = 0

    def __getitem__(self, rows: slice) -> StreamSlice:
        """``selection[n:]``: the same samples after the first n (``[:n]`` is not known)."""
        if not isinstance(rows, slice) or rows.step not in (None, 1) or rows.stop is not None:
            raise TypeError("a stream's samples can only be sliced as [n:]")
        return replace(self, start=self.start + (rows.start or 0))

    def __bool__(self) -> bool:
        return True

    def takes(self, sample: int) -> bool | None:
        """Whether sample ``sample`` (in stream order) is this job's; None past the limit."""
        if self.limit is not None and sample >= self.limit:
            return None
        return sample % self.shard_count == self.shard_index


def feed_for(dataset: Dataset):
    """The feed a dataset names in its ``feed`` attribute, or a TensorFeed."""
    return getattr(dataset, "feed", None) or TensorFeed()


def split_item(item) -> tuple[torch.Tensor, int | None]:
    """A dataset item as (input, integer target or None): items are a tensor, a 1-tuple, or
    an (input, target, ...) tuple.

    Raises:
        ConfigError: the target is not a single integer class.
    """
    if not isinstance(item, (tuple, list)):
        return item, None
    if len(item) < 2:
        return item[0], None
    try:
        return item[0], int(item[1])
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(
            f"dataset targets must be single class numbers, got {type(item[1]).__name__}; "
            "wrap the dataset so that its items are (input, int) or input alone"
        ) from None


class _Rows(Dataset):
    """``dataset`` seen through ``indices``, as (dataset index, input, target or -1)."""

    def __init__(self, dataset: Dataset, indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        inputs, target = split_item(self.dataset[index])
        return index, inputs, -1 if target is None else target


def batch_loader(rows: Dataset, collate, batch_size: int = 1, num_workers: int = 0,
                 pin_memory: bool = False, batch_sampler=None) -> DataLoader:
    """A DataLoader over ``rows`` in order (or in ``batch_sampler``'s batches), whose workers
    leave stop signals to the run."""
    sizing = ({"batch_sampler": batch_sampler} if batch_sampler is not None else
              {"batch_size": batch_size, "shuffle": False})
    return DataLoader(rows, num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory,
                      persistent_workers=False, worker_init_fn=leave_stop_signals_to_the_run,
                      **sizing)


def leave_stop_signals_to_the_run(worker_id: int) -> None:
    """A DataLoader worker ignores SIGINT and SIGTERM: Ctrl-C and SLURM's SIGTERM reach the
    whole process group, and a worker that died of them would make the loader raise before
    the run could stop at a batch boundary and commit; the run stops its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
