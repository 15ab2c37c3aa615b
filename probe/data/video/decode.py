"""Reading video files with PyAV (FFmpeg's demuxers and decoders): a file's frame times from
its packets alone, and the frames that windows take, each decoded once.

``probe_video`` demuxes a file without decoding it: the presentation time of every frame
(packets carry them), its end and its frame rate. ``FrameSource`` then serves the frames of
one window after another: it decodes forward through the file, keeps a decoded frame only
while a later window of the file still takes it, and seeks (to the keyframe before) only when
asked for frames behind it or far ahead of it. Windows asked in order, as a run asks them,
decode every frame once, and hold at most one window's frames: memory does not grow with the
film's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from probe.errors import DataError

__all__ = ["VideoHeader", "probe_video", "FrameSource"]


@dataclass(frozen=True)
class VideoHeader:
    """What a video file's packets say: each frame's presentation time in seconds (sorted),
    where the video ends, its frame rate, and its pts per frame (the stream's ticks, sorted,
    to find a decoded frame's index)."""

    times: list[Fraction]
    end: Fraction
    rate: Fraction
    pts: list[int]


def probe_video(path: Path, name: str) -> VideoHeader:
    """The header of the video file ``path`` (``name`` in messages).

    Raises:
        DataError: a file that FFmpeg cannot open, without a video stream, or without frames.
    """
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DataError(f"{name} holds no video stream; list video files only")
            stream = container.streams.video[0]
            base = stream.time_base
            ticks, last = [], None
            for packet in container.demux(stream):
                if packet.pts is not None and packet.size:
                    ticks.append(int(packet.pts))
                    last = packet
            rate = stream.average_rate or stream.guessed_rate
    except DataError:
        raise
    except Exception as err:  # FFmpeg's errors: not a video, truncated, unknown codec
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(f"{name} cannot be read as a video ({first}); fix or remove it") \
            from None
    if not ticks:
        raise DataError(f"{name} holds no frames; fix or remove it")
    if not rate:
        raise DataError(f"{name} does not say its frame rate; re-encode it with one")
    ticks.sort()
    rate = Fraction(rate)
    times = [Fraction(t - ticks[0]) * base for t in ticks]  # from the first frame's time
    # the video lasts until its last frame's own time is over
    tail = Fraction(last.duration) * base if last.duration else 1 / rate
    return VideoHeader(times, times[-1] + tail, rate, ticks)


class FrameSource:
    """The frames of one video file, decoded forward once (see the module's docstring).

    ``wanted`` lists, per window of the file in order, the frame indices it takes; ``take(w)``
    returns window ``w``'s frames as (frames, height, width, 3) uint8 RGB.
    """

    def __init__(self, path: Path, name: str, header: VideoHeader,
                 wanted: list[tuple[int, ...]]):
        self.path, self.name, self.header = path, name, header
        self.wanted = wanted
        # the last window that takes each frame: a decoded frame is let go after it
        self.last_use = {}
        for w, frames in enumerate(wanted):
            for index in frames:
                self.last_use[index] = w
        self.index_of = {pts: i for i, pts in enumerate(header.pts)}
        self.held: dict[int, np.ndarray] = {}
        self.decoded = 0  # frames decoded, for the tests and the benchmark
        self._container = None
        self._frames = None
        self._rgb = None  # one converter to RGB for the file: made anew per frame, it is slow
        self._next = 0  # the index of the next frame the decoder gives

    def take(self, window: int) -> np.ndarray:
        frames = self.wanted[window]
        missing = sorted(set(frames) - set(self.held))
        if missing:
            self._decode_until(missing, window)
        found = np.stack([self.held[i] for i in frames])
        # let go of what no later window takes (windows skipped, as a shard skips them, too)
        for index in [i for i in self.held if self.last_use[i] <= window]:
            del self.held[index]
        return found

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
        self._container = self._frames = None
        self.held.clear()

    def _decode_until(self, missing: list[int], window: int) -> None:
        span = max(len(self.wanted[window]), 1)
        if self._frames is None or missing[0] < self._next or missing[0] - self._next > 4 * span:
            self._seek(missing[0])
        needed = set(missing)
        try:
            while needed:
                frame = next(self._frames)
                index = self.index_of.get(int(frame.pts)) if frame.pts is not None else None
                if index is None:
                    continue
                self.decoded += 1
                self._next = index + 1
                if index in needed or self.last_use.get(index, -1) > window:
                    self.held[index] = self._rgb.reformat(frame, format="rgb24").to_ndarray()
                    needed.discard(index)
        except StopIteration:
            raise DataError(f"{self.name} ended before frame {min(needed)} that its packets "
                            "promised; re-encode it") from None
        except DataError:
            raise
        except Exception as err:  # FFmpeg's decoding errors
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(f"{self.name} cannot be decoded ({first}); fix or remove it") \
                from None

    def _seek(self, index: int) -> None:
        # to the keyframe at or before frame ``index``; the decoder then goes forward
        import av

        if self._container is None:
            from av.video.reformatter import VideoReformatter

            self._container = av.open(str(self.path))
            self._rgb = VideoReformatter()
            # frames decoded on several threads (set before the codec opens)
            self._container.streams.video[0].thread_type = "AUTO"
        stream = self._container.streams.video[0]
        self._container.seek(self.header.pts[index], stream=stream, backward=True,
                             any_frame=False)
        self._frames = self._container.decode(stream)
        self._next = -1  # unknown until the first frame comes
