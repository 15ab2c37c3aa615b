"""Video files cut into time windows: ``dataset=video dataset.root=<folder>`` or
``dataset=video dataset.path=videos.csv``; each window is one sample.

Files are listed as sound clips are (probe.data.listing: a folder of films or of class
subfolders, or a .csv/.jsonl list with a ``column`` of paths and an optional
``label_column``), demuxed by PyAV before the run to learn every frame's time (no pixels are
decoded for that), and cut into windows by the frame rule of probe.data.video.windows
(``clip_seconds``, ``step_seconds``, ``frames``, ``align``). A window's frames, decoded by
probe.data.video.decode, go through the model's own video processor (``transform``:
transformers' video processors, torchvision's video transforms; probe.families passes the
model's with ``transform=auto``), or, for a model without one, become a (3, frames, height,
width) float tensor in [0, 1].

Item ``i`` is window ``i``, windows in file order, each file's in time order:
``{"video", "file", "target", "onset", "duration"}``: ``onset`` is the window's time point in
seconds from its file's first frame, ``duration`` its length (``clip_seconds``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.listing import listed
from probe.data.video.decode import FrameSource, probe_video
from probe.data.video.feed import VideoFeed
from probe.data.video.windows import Align, exact, windows_of
from probe.errors import ConfigError

__all__ = ["VideoDataset", "plain_frames"]

log = logging.getLogger(__name__)

_SUFFIXES = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v")


def plain_frames(frames: torch.Tensor) -> torch.Tensor:
    """A window's (frames, H, W, 3) uint8 RGB frames as the (3, frames, H, W) float32 tensor
    in [0, 1] that 3-D convolutions take: the input of a model without a video processor."""
    return frames.permute(3, 0, 1, 2).to(torch.float32) / 255


class VideoDataset(Dataset):
    """Windows of video files (see the module's docstring).

    Example::

        data = VideoDataset(root="movies", clip_seconds=4, step_seconds=0.5, frames=16)
        item = data[0]      # video: the model's input for window 0; onset 0.0 (align=end)

    Raises:
        DataError: a root or path that does not exist or lists no videos; a video FFmpeg
            cannot read, or without frames.
        ConfigError: neither or both of root and path; windows that do not fit the videos
            (longer than one, more frames than one holds); bad options.
    """

    feed = VideoFeed()

    def __init__(self, root: str | None = None, path: str | None = None, column: str = "video",
                 label_column: str | None = None, clip_seconds: float = 2.0,
                 step_seconds: float = 1.0, frames: int | None = None, align: str = "end",
                 transform: str | Callable = "auto"):
        try:
            import av
        except ImportError:
            raise ConfigError("dataset=video needs PyAV: pip install 'probe[video]'") from None
        self.decoder = f"PyAV {av.__version__}"
        listing = listed("video", root, path, _SUFFIXES, column, label_column, {},
                         "video files", "videos")
        self.source = str(root if root is not None else path)
        self.base, self.paths, self.files = listing.base, listing.paths, listing.files
        self.targets, self.classes = listing.targets, listing.classes
        self.has_targets = self.targets is not None
        self.transform = plain_frames if transform in ("auto", None) else transform
        if isinstance(self.transform, str):
            raise ConfigError(f"dataset.transform={transform!r}: dataset=video takes auto (the "
                              "model's own video processor) or a callable")
        self.clip, self.step = _positive(clip_seconds, "clip_seconds"), _positive(
            step_seconds, "step_seconds")
        self.frames = _frames(frames, self.transform)
        try:
            self.align = Align(str(align))
        except ValueError:
            raise ConfigError(f"dataset.align={align!r}: use end (a window ends at its time "
                              "point), start or center") from None
        self.headers = [probe_video(p, f) for p, f in zip(self.paths, self.files, strict=True)]
        self.windows = [windows_of(h.times, h.end, h.rate, self.clip, self.step, self.frames,
                                   self.align, f)
                        for h, f in zip(self.headers, self.files, strict=True)]
        self.starts = np.cumsum([0] + [len(w) for w in self.windows])
        self._sources: dict[int, FrameSource] = {}
        self._decoded = 0  # frames decoded by the decoders closed so far

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} windows")
        file, window = self.locate(index)
        frames = self._source(file).take(window)
        return {"video": self.transform(torch.from_numpy(frames)), "file": self.files[file],
                "target": -1 if self.targets is None else int(self.targets[file]),
                "onset": float(self.windows[file][window].onset),
                "duration": float(self.clip)}

    def locate(self, index: int) -> tuple[int, int]:
        """(file, window of that file) of sample ``index``."""
        file = bisect.bisect_right(self.starts, index) - 1
        return file, index - int(self.starts[file])

    @property
    def decoded_frames(self) -> int:
        """Frames decoded so far in this process (every file's)."""
        return self._decoded + sum(source.decoded for source in self._sources.values())

    def describe(self) -> dict:
        """Root attrs that say how the videos became windows."""
        rates = sorted({float(h.rate) for h in self.headers})
        return {"clip_seconds": float(self.clip), "step_seconds": float(self.step),
                "frames": self.frames, "align": self.align.value, "decoder": self.decoder,
                "source_frame_rates": rates, "windows": len(self),
                "videos": len(self.paths)}

    def fingerprint(self) -> dict:
        """The files (relative paths and sizes), the windows and the preprocessing."""
        lines = sorted(f"{f}:{p.stat().st_size if p.exists() else -1}"
                       for f, p in zip(self.files, self.paths, strict=True))
        windows = json.dumps({k: v for k, v in self.describe().items() if k != "decoder"},
                             sort_keys=True)
        return {"video_files": _digest("\n".join(lines)), "windows": _digest(windows),
                "video_transform": _digest(" ".join(repr(self.transform).split()))}

    def _source(self, file: int) -> FrameSource:
        # one file's decoder at a time: a run asks for the windows in file order
        if file not in self._sources:
            for other in list(self._sources):
                closed = self._sources.pop(other)
                self._decoded += closed.decoded
                closed.close()
            self._sources[file] = FrameSource(self.paths[file], self.files[file],
                                              self.headers[file],
                                              [w.frames for w in self.windows[file]])
        return self._sources[file]

    def __getstate__(self) -> dict:
        # a loader worker opens its own decoders
        return {**self.__dict__, "_sources": {}, "_decoded": 0}


def _positive(value, key: str):
    try:
        seconds = exact(value)
    except (TypeError, ValueError):
        raise ConfigError(f"dataset.{key}={value!r} must be seconds, a number above 0") \
            from None
    if seconds <= 0:
        raise ConfigError(f"dataset.{key}={float(value):g} must be seconds, a number above 0")
    return seconds


def _frames(frames, transform) -> int:
    # dataset.frames, or what the model's processor expects
    if frames is None:
        frames = getattr(transform, "frames", None)
        if frames is None:
            raise ConfigError("dataset.frames is not set and the model does not say how many "
                              "frames it takes; set dataset.frames=<frames per window>")
    if int(frames) != frames or int(frames) < 1:
        raise ConfigError(f"dataset.frames={frames} must be a whole number of frames, 1 or "
                          "more")
    return int(frames)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]

