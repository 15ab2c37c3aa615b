"""How clips of sound reach a speech or audio encoder: the feed of ``dataset=audio``.

Batches are made by the checkpoint's own feature extractor (padding to the longest clip, or,
for an extractor with a window of its own such as Whisper's 30 s, to that window), in the
loader's workers. Rows are frames, as tokens are for text: one per real frame of each clip
(``keep``), recorded with its position in the clip (``/positions``; its time is
``position / frame_rate``, the root attr), never a frame of padding. Which frames are real is
the model's own business: the plan gives the feed the family's length function
(``Feed.for_model``: wav2vec2's ``_get_feat_extract_output_lengths``) before any batch is made,
which maps each clip's real input length (the extractor's mask) to its real frames.

Rows know their time: ``/onset`` (one per frame row) is ``position / frame_rate`` seconds
from the start of its clip, ``/duration`` (one per clip) the clip's length in seconds.

Long recordings (``dataset.window_seconds``, ``stride_seconds``): each clip is cut into
windows that start every stride (a whole number of frames), fed as rows of one batch (a
``Pieces`` layout, probe.data.layouts); of the frames that several windows compute, each is
stored once, from the window where it has the most context (the most frames on its shorter
side), so that a clip's rows are its frames in order, as without windows.

A model that cannot mask padding (its extractor gives no attention mask) would compute other
values for a padded clip than for the clip alone: its batches then hold only clips of the same
length (runs of them, in the planned order; with ``bucket_by_length`` these are long), and
every other clip runs alone. The log says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from probe.data.buckets import plan_batches, planned_batches
from probe.data.feed import Batch, Batching, DataKind, Feed, LoadedItems, loadable
from probe.data.layouts import Pieces, Positions
from probe.data.selection import OpenSelection, Selection
from probe.errors import ConfigError, DataError
from probe.file.format import DURATION, FILE, ONSET, POSITIONS, TRANSCRIPT, Attr, DatasetSpec

__all__ = ["AudioFeed"]

log = logging.getLogger(__name__)


class AudioFeed(Feed):
    """The feed of clips of sound: see the module's docstring."""

    kind = DataKind.audio
    unit = "clip"
    positions = True
    hint = "a clip shorter than the model's convolutional stem, or a model for other inputs?"
    targets_hint = "dataset.root with one subfolder per class, or dataset.label_column"

    def __init__(self, frames: Callable[[torch.Tensor], torch.Tensor] | None = None):
        # the model's length function (real input lengths, in the units of the extractor's
        # mask, -> real frames)
        self._frames = frames

    def for_model(self, output_lengths: Callable[[torch.Tensor], torch.Tensor] | None
                  ) -> AudioFeed:
        """This feed for a model whose length function is ``output_lengths``."""
        return AudioFeed(output_lengths)

    # -- what the plan asks -------------------------------------------------------------------

    def has_targets(self, dataset, sample: int) -> bool:
        return dataset.has_targets

    def loader(self, dataset, selection: Selection, batching: Batching):
        """Batches over ``selection``: in dataset order, or bucketed by length within groups;
        for a model that cannot mask padding, only clips of equal length together."""
        if isinstance(selection, OpenSelection):
            raise ConfigError("dataset=audio lists its files before the run; an open selection "
                              "is for corpora read as they come")
        lengths = dataset.lengths(selection)
        own = _window(dataset.extractor)
        if own is not None and dataset.window_seconds is None and (lengths > own).any():
            log.warning("%d clips are longer than the model's window of %g s, and its feature "
                        "extractor cuts them there; set dataset.window_seconds to keep all "
                        "their frames", int((lengths > own).sum()), own / dataset.sampling_rate)
        planned = plan_batches(lengths, batching)
        if not self.pads_freely(dataset):
            log.info("the feature extractor %s gives the model no attention mask, so padding "
                     "would change its values: batches hold only clips of equal length, and "
                     "the others run one by one", dataset.extractor_name)
            planned = [(part, ends and n == len(parts) - 1)
                       for positions, ends in planned
                       for parts in [_equal_runs(positions, lengths)]
                       for n, part in enumerate(parts)]
        collate = partial(self.collate, dataset, skip_bad=batching.skip_bad)
        yield from planned_batches(dataset, selection, planned, collate, batching)

    def dry_batches(self, dataset, index: int) -> list[Batch]:
        """The clip alone, and its first four fifths alone: an output whose second axis
        follows the clip's length is a layout of frames."""
        row = LoadedItems(dataset, [index])[0]
        if isinstance(row[1], str):
            raise DataError(row[1])
        shorter = {**row[1], "audio": row[1]["audio"][: max(1, len(row[1]["audio"]) * 4 // 5)]}
        return [self.collate(dataset, [row]), self.collate(dataset, [(row[0], shorter)])]

    def bookkeeping(self, dataset) -> dict[str, DatasetSpec]:
        """Each clip's file (and transcript); each frame row's position in its clip comes with
        the batch's layout."""
        specs = {FILE: DatasetSpec((), "str", {Attr.DIMS: ["sample"]}, compressible=False),
                 DURATION: DatasetSpec((), "float64", {Attr.DIMS: ["sample"]},
                                       compressible=False)}
        if dataset.transcripts is not None:
            specs[TRANSCRIPT] = DatasetSpec((), "str", {Attr.DIMS: ["sample"]},
                                            compressible=False)
        return specs

    def attrs(self, dataset) -> dict:
        found = {**dataset.describe(), "frame_rate": self.frame_rate(dataset),
                 "batching": ("clips padded together" if self.pads_freely(dataset) else
                              "clips of equal length together, others alone")}
        if dataset.classes:
            found[Attr.CLASSES] = [str(c) for c in dataset.classes]
        return found

    def describe(self, batch: Batch) -> str:
        return f"{batch.layout.length} frames"

    # -- how batches are made ----------------------------------------------------------------

    def pads_freely(self, dataset) -> bool:
        """Whether clips of different lengths may share a batch: the extractor gives the
        model an attention mask, or pads every clip to a window of its own (Whisper)."""
        extractor = dataset.extractor
        return bool(extractor.return_attention_mask) or _window(extractor) is not None

    def frame_rate(self, dataset) -> float:
        """Frames per second: the model's frames for 100 s more of input."""
        start = round(100 * _mask_rate(dataset.extractor))
        frames = self._bound()(torch.tensor([start, 2 * start]))
        return float(frames[1] - frames[0]) / 100

    def collate(self, dataset, rows: list[tuple[int, dict | str]],
                skip_bad: bool = False) -> Batch:
        """A batch of clips (or of their windows) through the feature extractor, ``keep``
        marking the real frames that each row stores."""
        rows, skipped, instead = loadable(rows, skip_bad)
        if instead is not None:
            return instead
        items = [item for _, item in rows]
        cuts = [self._windows(dataset, len(item["audio"])) for item in items]
        sounds = [item["audio"][a:b] for item, cut in zip(items, cuts, strict=True)
                  for a, b in cut]
        extractor = dataset.extractor
        padding = {} if _window(extractor) is not None else {"padding": "longest"}
        features = dict(extractor(sounds, sampling_rate=dataset.sampling_rate,
                                  return_attention_mask=True, return_tensors="pt", **padding))
        mask = features.pop("attention_mask").bool()
        if extractor.return_attention_mask:  # else the model is not given one
            features["attention_mask"] = mask.long()
        frames = self._bound()
        real = frames(mask.sum(1)).long().clamp_min(0)
        length = int(frames(torch.tensor([mask.shape[1]]))[0])
        keep, positions = _stitched(real, length, cuts, self._samples_per_frame(dataset))
        index = torch.tensor([i for i, _ in rows], dtype=torch.int64)
        windowed = dataset.window_seconds is not None
        sample_rows = {FILE: np.array([item["file"] for item in items], dtype=object),
                       DURATION: np.array([len(item["audio"]) / dataset.sampling_rate
                                           for item in items], dtype=np.float64)}
        if dataset.transcripts is not None:
            sample_rows[TRANSCRIPT] = np.array([item["transcript"] for item in items],
                                               dtype=object)
        # each frame's time in its clip: its position over the model's frame rate
        stored = {POSITIONS: positions,
                  ONSET: positions.to(torch.float64) / self.frame_rate(dataset)}
        layout = (Pieces(keep, stored, axis="frame", piece_sample=torch.repeat_interleave(
            torch.arange(len(items)), torch.tensor([len(cut) for cut in cuts])))
            if windowed else Positions(keep, stored, axis="frame"))
        return Batch(index, torch.tensor([item["target"] for item in items], dtype=torch.int64),
                     features, layout=layout, sample_rows=sample_rows, skipped=skipped)

    def _windows(self, dataset, samples: int) -> list[tuple[int, int]]:
        # (start, stop) of each window of a clip of ``samples``: one, without windows
        if dataset.window_seconds is None:
            return [(0, samples)]
        own = _window(dataset.extractor)
        if own is not None and dataset.window_seconds * dataset.sampling_rate > own:
            raise ConfigError(f"dataset.window_seconds={dataset.window_seconds} is longer than "
                              f"the model's own window of {own / dataset.sampling_rate:g} s, "
                              "which would cut it; use at most that")
        if not self.pads_freely(dataset):
            raise ConfigError("dataset.window_seconds needs a feature extractor that gives "
                              f"the model an attention mask, and {dataset.extractor_name!r} "
                              "gives none (a clip's last window is shorter, and padding would "
                              "change its values); feed whole clips")
        per_frame = self._samples_per_frame(dataset)
        width = round(dataset.window_seconds * dataset.sampling_rate)
        stride = max(1, round(dataset.stride_seconds * dataset.sampling_rate / per_frame))
        stride *= per_frame  # windows start on a frame
        cuts, start = [], 0
        while True:
            cuts.append((start, min(start + width, samples)))
            if start + width >= samples:
                return cuts
            start += stride

    def _samples_per_frame(self, dataset) -> int:
        return round(dataset.sampling_rate / self.frame_rate(dataset))

    def _bound(self) -> Callable:
        if self._frames is None:
            raise ConfigError("dataset=audio is read by an audio model (model=transformers "
                              "with a speech or audio checkpoint); this model does not say "
                              "how many frames a clip gives")
        return self._frames


def _stitched(real: torch.Tensor, length: int, cuts: list[list[tuple[int, int]]],
              per_frame: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keep (rows, length): the frames each row stores, and (kept,) the position of each in
    its clip. A clip's rows are its windows (``cuts``, in samples); a frame that several of
    them compute is kept from the one where it has the most context (ties: the earlier)."""
    frames = torch.arange(length)
    keep = frames < real.view(-1, 1)
    if all(len(cut) == 1 for cut in cuts):
        return keep, frames.expand(len(real), length)[keep].to(torch.int32)
    positions, row = [], 0
    for cut in cuts:
        rows = range(row, row + len(cut))
        starts = [a // per_frame for a, _ in cut]
        total = max(s + int(real[r]) for s, r in zip(starts, rows, strict=True))
        best = torch.full((total,), -1)
        context = torch.full((total,), -1)
        for s, r in zip(starts, rows, strict=True):
            n = int(real[r])
            here = torch.minimum(torch.arange(n), n - 1 - torch.arange(n))
            better = here > context[s:s + n]
            context[s:s + n] = torch.where(better, here, context[s:s + n])
            best[s:s + n] = torch.where(better, r, best[s:s + n])
        for s, r in zip(starts, rows, strict=True):
            mine = best[s:s + int(real[r])] == r
            keep[r] = False
            keep[r, :len(mine)] = mine
            positions.append(s + torch.nonzero(mine).flatten())
        row += len(cut)
    return keep, torch.cat(positions).to(torch.int32)


def _window(extractor) -> int | None:
    # the fixed input, in samples, of an extractor that pads every clip to it (Whisper's 30 s)
    samples = getattr(extractor, "n_samples", None)
    return None if samples is None else int(samples)


def _mask_rate(extractor) -> float:
    # positions of the extractor's mask per second: samples, or spectrogram frames
    hop = getattr(extractor, "hop_length", None)
    return extractor.sampling_rate / (hop if hop else 1)


def _equal_runs(positions: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    # a planned batch cut where the clips' lengths change
    cuts = np.flatnonzero(np.diff(lengths[positions])) + 1
    return np.split(positions, cuts)

