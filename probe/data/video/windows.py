"""Which frames each time window of a video shows: the frame rule of ``dataset=video``, on the
frames' presentation times alone (no pixels), so that the run knows every window, and every
frame it will decode, before the first forward.

Time points lie at ``k * step`` seconds (k = 0, 1, ...). The window of a time point ``p`` spans
``[p - clip, p)`` (``align=end``: the window ends at its time point), ``[p, p + clip)``
(``start``) or ``[p - clip / 2, p + clip / 2)`` (``center``); the last window ends at or before
the video's end. A window shows every frame whose presentation time ``t`` lies in
``[start, end)``; where it begins before 0 s, the video is taken to hold copies of its first
frame before 0 s at its frame rate (at ``-1 / rate``, ``-2 / rate``, ...), so the window's
first part repeats the first frame. Of the ``count`` frames a window shows, it takes
``frames``, at the indices ``numpy.linspace(0, count - 1, frames)`` rounded to the nearest
(ties to even, as numpy and torch round).

Times are exact fractions (the stream's time base; ``clip`` and ``step`` as the decimals they
were written as), so that a frame on a window's edge lies on the side the rule says.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

import numpy as np

from probe.errors import ConfigError

__all__ = ["Align", "Window", "windows_of", "exact"]


class Align(Enum):
    """Where a window lies around its time point."""

    end = "end"  # [p - clip, p): each time point sees the seconds before it
    start = "start"  # [p, p + clip)
    center = "center"  # [p - clip / 2, p + clip / 2)


@dataclass(frozen=True)
class Window:
    """One window of one video: its time point in seconds, and the frames it takes, as
    indices into the video's frames in presentation order (0 also stands for the copies of
    the first frame before 0 s)."""

    onset: Fraction  # the window's time point
    frames: tuple[int, ...]


def exact(value: float | str) -> Fraction:
    """``value`` (seconds, as written in the config) as an exact fraction: 1.49 is 149/100,
    not the binary float nearest to it."""
    return Fraction(str(value))


def windows_of(times: list[Fraction], end: Fraction, rate: Fraction, clip: Fraction,
               step: Fraction, frames: int, align: Align, name: str) -> list[Window]:
    """The windows of a video whose frames lie at ``times`` (sorted, seconds) and which ends
    at ``end``, at ``rate`` frames per second.

    Raises:
        ConfigError: the window is longer than the video, or holds fewer frames than
            ``frames`` (naming the video, its frame rate and the fix).
    """
    if clip > end:
        raise ConfigError(f"dataset.clip_seconds={float(clip):g} is longer than {name} "
                          f"({float(end):g} s); use shorter windows, or leave the video out")
    before = {Align.end: clip, Align.start: Fraction(0), Align.center: clip / 2}[align]
    found, k = [], 0
    while True:
        onset = k * step
        start = onset - before
        if start + clip > end:
            return found
        found.append(Window(onset, _taken(times, start, start + clip, rate, frames, name)))
        k += 1


def _taken(times: list[Fraction], start: Fraction, stop: Fraction, rate: Fraction,
           frames: int, name: str) -> tuple[int, ...]:
    # the frames a window [start, stop) takes: the first frame's copies before 0 s, then the
    # video's own frames in it, ``frames`` of them evenly
    copies = math.floor(-start * rate) if start < 0 else 0  # at -1/rate, -2/rate, ... >= start
    first = bisect.bisect_left(times, start)
    last = bisect.bisect_left(times, stop)
    shown = [0] * copies + list(range(first, last))
    if len(shown) < frames:
        raise ConfigError(
            f"a window of {name} from {float(start):g} s to {float(stop):g} s holds "
            f"{len(shown)} frames (the video has {float(rate):g} frames per second), fewer "
            f"than dataset.frames={frames}; take fewer frames, or longer windows")
    picks = np.rint(np.linspace(0, len(shown) - 1, frames)).astype(np.int64)
    return tuple(shown[i] for i in picks)
