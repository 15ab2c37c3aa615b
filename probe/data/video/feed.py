"""How windows of video reach a video model: the feed of ``dataset=video``.

A window is a sample: its frames, through the model's processor, are one input of the batch
(stacked), and its rows are one per window, as an image's (a video transformer's tokens lie on
a grid of tubelets: probe.data.layouts.PatchGrid). Each window stores its time: ``/onset``, the
window's time point in seconds from its file's first frame, ``/duration`` its length, beside
``/file``. Batches hold consecutive windows, so a file's frames are decoded once (see
probe.data.video.decode).
"""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import torch

from probe.data.feed import Batch, Batching, DataKind, Feed, LoadedItems, batch_loader, loadable
from probe.data.selection import OpenSelection, Selection
from probe.errors import ConfigError, DataError
from probe.file.format import DURATION, FILE, ONSET, Attr, DatasetSpec

__all__ = ["VideoFeed"]

_PER_SAMPLE = {Attr.DIMS: ["sample"]}


class VideoFeed(Feed):
    """The feed of windows of video: see the module's docstring."""

    kind = DataKind.video
    unit = "window"
    positions = False
    hint = "frames of another size or number than the model takes (dataset.frames)?"
    targets_hint = "dataset.root with one subfolder per class, or dataset.label_column"

    def has_targets(self, dataset, sample: int) -> bool:
        return dataset.has_targets

    def loader(self, dataset, selection: Selection, batching: Batching):
        """Batches of consecutive windows over ``selection``, in order."""
        if isinstance(selection, OpenSelection):
            raise ConfigError("dataset=video lists its windows before the run; an open "
                              "selection is for corpora read as they come")
        rows = LoadedItems(dataset, list(selection))
        return batch_loader(rows, partial(self.collate, skip_bad=batching.skip_bad),
                            batching.batch_size, batching.num_workers, batching.pin_memory)

    def dry_batches(self, dataset, index: int) -> list[Batch]:
        row = LoadedItems(dataset, [index])[0]
        if isinstance(row[1], str):
            raise DataError(row[1])
        return [self.collate([row])]

    def bookkeeping(self, dataset) -> dict[str, DatasetSpec]:
        return {FILE: DatasetSpec((), "str", _PER_SAMPLE, compressible=False),
                ONSET: DatasetSpec((), "float64", _PER_SAMPLE, compressible=False),
                DURATION: DatasetSpec((), "float64", _PER_SAMPLE, compressible=False)}

    def attrs(self, dataset) -> dict:
        from probe.data.transforms import describe_transform

        found = {**dataset.describe(),
                 "transform": json.dumps(describe_transform(dataset.transform))}
        if dataset.classes:
            found[Attr.CLASSES] = [str(c) for c in dataset.classes]
        return found

    def describe(self, batch: Batch) -> str:
        return f"a window of shape {tuple(batch.inputs.shape[1:])}"

    @staticmethod
    def collate(rows: list[tuple[int, dict | str]], skip_bad: bool = False) -> Batch:
        """Windows stacked into one input; their files and times as bookkeeping."""
        rows, skipped, instead = loadable(rows, skip_bad)
        if instead is not None:
            return instead
        items = [item for _, item in rows]
        return Batch(torch.tensor([i for i, _ in rows], dtype=torch.int64),
                     torch.tensor([item["target"] for item in items], dtype=torch.int64),
                     torch.stack([item["video"] for item in items]),
                     sample_rows={
                         FILE: np.array([item["file"] for item in items], dtype=object),
                         ONSET: np.array([item["onset"] for item in items], dtype=np.float64),
                         DURATION: np.array([item["duration"] for item in items],
                                            dtype=np.float64)},
                     skipped=skipped)
