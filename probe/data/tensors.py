"""The feed of datasets whose items are a tensor or a (tensor, target) pair: images, or any
array. A batch stacks the tensors; rows are one per sample. A dataset that lists its files
(torchvision's ImageFolder and DatasetFolder: ``samples`` and ``root``) also stores each row's
file, relative to the root, as ``/file``, and its class names as the root attr ``classes``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.feed import Batch, Batching, DataKind, Feed, bad_sample, batch_loader
from probe.data.selection import Selection
from probe.errors import ConfigError, DataError
from probe.file.format import FILE, Attr, DatasetSpec

__all__ = ["TensorFeed", "split_item", "sample_files"]

log = logging.getLogger(__name__)


class TensorFeed(Feed):
    """Items are a tensor or a (tensor, int target, ...) tuple."""

    kind = DataKind.tensors
    unit = "sample"
    positions = False
    hint = "a dataset.image_size too small for it?"
    targets_hint = "items (input, target)"

    def has_targets(self, dataset: Dataset, sample: int) -> bool:
        return split_item(dataset[sample])[1] is not None

    def loader(self, dataset: Dataset, selection: Selection,
               batching: Batching) -> Iterable[Batch]:
        """Batches of ``batching.batch_size`` over ``selection``, in order."""
        rows = self._rows(dataset, selection, skip_bad=batching.skip_bad)
        return batch_loader(rows, rows.collate, batching.batch_size, batching.num_workers,
                            batching.pin_memory)

    def dry_batches(self, dataset: Dataset, index: int) -> list[Batch]:
        rows = self._rows(dataset, [index])
        batch = rows.collate([rows[0]])
        if batch.failure is not None:
            raise DataError(batch.failure)
        return [batch]

    def bookkeeping(self, dataset: Dataset) -> dict[str, DatasetSpec]:
        if sample_files(dataset) is None:
            return {}
        return {FILE: DatasetSpec((), "str", {Attr.DIMS: ["sample"]}, compressible=False)}

    def attrs(self, dataset: Dataset) -> dict:
        """The transform of an image dataset, and the class names of a file-backed one."""
        found = {}
        transform = getattr(dataset, "transform", None)
        if transform is not None:
            from probe.data.transforms import describe_transform

            found["transform"] = json.dumps(describe_transform(transform))
        classes = getattr(dataset, "classes", None)
        if sample_files(dataset) is not None and isinstance(classes, list) and classes:
            found[Attr.CLASSES] = [str(c) for c in classes]
        return found

    def describe(self, batch: Batch) -> str:
        return f"shape {tuple(batch.inputs.shape[1:])}"

    @staticmethod
    def _rows(dataset: Dataset, indices: list[int], skip_bad: bool = False):
        # the selected samples as a Dataset whose collate makes a Batch (a sibling feed's own)
        return _Rows(dataset, indices, skip_bad=skip_bad)


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


def sample_files(dataset: Dataset) -> list[str] | None:
    """Each sample's file relative to the dataset's root, for a dataset that lists them as
    torchvision's folder datasets do (``samples``: [(path, target), ...], and ``root``)."""
    samples, root = getattr(dataset, "samples", None), getattr(dataset, "root", None)
    if not (isinstance(samples, list) and samples and root is not None
            and isinstance(samples[0], (tuple, list)) and isinstance(samples[0][0], (str,
                                                                                    os.PathLike))):
        return None
    return [os.path.relpath(path, root) for path, *_ in samples]


class _Rows(Dataset):
    """``dataset`` seen through ``indices``, as (dataset index, input, target or -1); a sample
    that cannot be loaded is a DataError naming it, or, with ``skip_bad``, None (logged)."""

    def __init__(self, dataset: Dataset, indices: list[int], skip_bad: bool = False):
        self.dataset, self.indices, self.skip_bad = dataset, indices, skip_bad
        self.files = sample_files(dataset)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        index = self.indices[i]
        try:
            inputs, target = split_item(self.dataset[index])
        except ConfigError:
            raise
        except Exception as err:  # the dataset's own code failed on this sample
            said = bad_sample(index, err, self.files[index] if self.files else "")
            if self.skip_bad:
                log.warning("left out (dataset.on_error=skip): %s", said.split(";")[0])
            return index, None, said
        return index, inputs, -1 if target is None else target

    def collate(self, rows: list[tuple[int, torch.Tensor | None, int | str]]) -> Batch:
        bad = [(index, said) for index, inputs, said in rows if inputs is None]
        if bad and not self.skip_bad:  # raised by the loader, in the run's process
            return Batch(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                         torch.empty(0), failure=bad[0][1])
        skipped = [index for index, _ in bad]
        rows = [row for row in rows if row[1] is not None]
        index = torch.tensor([row[0] for row in rows], dtype=torch.int64)
        target = torch.tensor([row[2] for row in rows], dtype=torch.int64)
        inputs = torch.stack([row[1] for row in rows]) if rows else torch.empty(0)
        sample_rows = ({} if self.files is None else
                       {FILE: np.array([self.files[i] for i in index.tolist()], dtype=object)})
        return Batch(index, target, inputs, sample_rows=sample_rows, skipped=skipped)


def feed_for(dataset: Dataset) -> Feed:
    """The feed a dataset names in its ``feed`` attribute, or a TensorFeed."""
    own = getattr(dataset, "feed", None)
    if own is not None:
        return own
    return TensorFeed()
