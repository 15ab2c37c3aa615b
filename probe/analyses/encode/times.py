"""When each stored row of a key happened, in seconds: from onsets given by hand (``onsets=``),
or from the file's own ``/onset`` (timed data: video windows, audio clips, word-timed stories).

Onsets come one per sample or one per stored row (a token's word onset, a frame's time in its
clip). Per stored row, each row is at its own onset; per sample, a sample's row is at its
onset, and its frames at the onset plus ``position / frame_rate`` (tokens without a frame rate:
at the sample's onset, where the file's /onset says so). A sample's row in a file whose onsets
are per stored row is at the onset of its first row.
"""

from __future__ import annotations

import numpy as np

from probe.errors import ConfigError, DataError
from probe.file.format import ONSET, POSITIONS, Attr
from probe.file.read import FeatureFile

__all__ = ["row_times", "stored_times", "has_stored_onsets"]

FRAME_RATE = "frame_rate"  # the root attr of audio runs: frames per second (DESIGN.md)


def row_times(f: FeatureFile, key: str, onsets: np.ndarray, option: str,
              ordered: bool = True) -> np.ndarray:
    """When each stored row of ``key`` happened, by ``onsets`` given by hand: one per dataset
    sample (indexed by ``/index``) or one per stored row.

    Args:
        ordered: the onsets run through one recording, so they must not decrease (with
            several runs, each restarts at its file's start).

    Raises:
        ConfigError: the onsets have neither a value per sample nor one per stored row, or
            they decrease, or frame rows in a file without a frame rate.
    """
    onsets = np.asarray(onsets, dtype=np.float64).reshape(-1)
    if not np.isfinite(onsets).all():
        raise ConfigError(f"{option} holds NaN or an infinity; give every onset in seconds")
    if not f.per_token(key):
        index = f.index
        if len(onsets) <= int(index.max()):
            raise ConfigError(f"{option} has {len(onsets)} onsets, but {str(f.path)!r} holds "
                              f"sample {int(index.max())}; give one onset per dataset sample")
        _check_increasing(onsets, option, "sample", ordered)
        return onsets[index]
    stored = int(f.offsets[-1])
    if len(onsets) == stored:  # one per stored row: a token's word onset, say
        _check_increasing(onsets, option, "row", ordered)
        return onsets
    if len(onsets) <= int(f.index.max()):
        raise ConfigError(f"{option} has {len(onsets)} onsets; {key} holds {stored} rows of "
                          f"{f.num_rows} samples: give one onset per dataset sample (frames are "
                          "placed by the frame rate) or one per stored row")
    rate = f.attrs.get(FRAME_RATE)
    if rate is None:
        raise ConfigError(f"{option} has one onset per sample, but {key} holds rows per token "
                          "and the file has no frame rate to place them by; give one onset "
                          "per stored row")
    _check_increasing(onsets, option, "sample", ordered)
    return onsets[np.repeat(f.index, np.diff(f.offsets))] + _positions(f) / float(rate)


def has_stored_onsets(f: FeatureFile) -> bool:
    """Whether the file says when its rows happened (``/onset``)."""
    return ONSET in f


def stored_times(f: FeatureFile, key: str) -> np.ndarray:
    """When each stored row of ``key`` happened, in seconds from the start of its ``/file``,
    by the file's ``/onset`` (see the module's docstring).

    Raises:
        DataError: /onset holds NaN or an infinity, or a sample without rows where its
            sample's time is that of its first row.
    """
    onset = f[ONSET]
    offsets = f.offsets
    stored = int(offsets[-1]) if offsets is not None else f.num_rows
    if _per_row(onset, offsets):
        values = np.asarray(onset[:stored], dtype=np.float64)
        if not f.per_token(key):  # a sample at the time of its first row
            lengths = np.diff(offsets)
            if (lengths == 0).any():
                raise DataError(f"{str(f.path)!r}: sample row {int(np.argmin(lengths))} has no "
                                f"rows to take its time from (/onset is per row); give "
                                "onsets=O.npy by hand")
            values = values[offsets[:-1]]
    else:
        values = np.asarray(onset[: f.num_rows], dtype=np.float64)
        if f.per_token(key):
            rate = f.attrs.get(FRAME_RATE)
            values = np.repeat(values, np.diff(offsets))
            if rate is not None:  # a frame's time: its sample's start plus its position
                values = values + _positions(f) / float(rate)
    if not np.isfinite(values).all():
        raise DataError(f"{str(f.path)!r}: /onset holds NaN or an infinity for rows of {key}; "
                        "give onsets=O.npy by hand")
    return values


def _per_row(onset, offsets: np.ndarray | None) -> bool:
    # /onset is per stored position where its length is the positions' (T,) and its dims do
    # not call its rows samples (T may equal N)
    if offsets is None or len(onset) != int(offsets[-1]):
        return False
    dims = [str(d) for d in np.atleast_1d(onset.attrs.get(Attr.DIMS, []))]
    return not dims or dims[0] != "sample"


def _positions(f: FeatureFile) -> np.ndarray:
    # each stored row's position in its sample: the file's /positions, or its place in order
    offsets = f.offsets
    stored = int(offsets[-1])
    if POSITIONS in f:
        return np.asarray(f[POSITIONS][:stored])
    return np.arange(stored) - np.repeat(offsets[:-1], np.diff(offsets))


def _check_increasing(onsets: np.ndarray, option: str, unit: str, ordered: bool) -> None:
    if not ordered:
        return
    back = np.flatnonzero(np.diff(onsets) < 0)
    if len(back):
        i = int(back[0])
        raise ConfigError(f"{option}: the onset of {unit} {i + 1} ({onsets[i + 1]:g} s) comes "
                          f"before that of {unit} {i} ({onsets[i]:g} s); onsets must not "
                          "decrease")
