"""Sound files as a dataset of clips: ``dataset=audio dataset.root=<folder>`` or
``dataset=audio dataset.path=clips.csv``.

Files are decoded by soundfile (libsndfile: wav, flac, ogg and what else it reads), mixed to
mono by averaging their channels, and resampled by soxr to the sampling rate of the model's
own feature extractor (``transformers.AutoFeatureExtractor``, from the model's folder or Hub
id). Both are recorded in the file's root attrs. Only the files' headers are read before the
run (lengths, for bucketing, and rates); the sound itself is decoded as the batches are made.

Two ways to list the clips:

- ``root``: one subfolder per class, as ``dataset=imagefolder``; the targets are the class
  indices (sorted names), stored as /target, the names as the root attr ``classes``;
- ``path``: a .csv or .jsonl file with a column of paths (``column``, default ``audio``;
  relative to the file's folder, or absolute) and, optionally, ``label_column``: integer
  labels, or names (then numbered in sorted order and recorded as ``classes``), and
  ``transcript_column``: each clip's text, stored as /transcript, which ``objective=nll`` of
  a CTC head scores.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
from torch.utils.data import Dataset

from probe.data.audio.feed import AudioFeed
from probe.data.feed import bad_sample
from probe.data.listing import listed
from probe.errors import ConfigError, DataError

__all__ = ["AudioDataset"]

log = logging.getLogger(__name__)

_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".aif", ".aiff")


class AudioDataset(Dataset):
    """Clips of sound at the feature extractor's rate: item i is ``{"audio", "target",
    "file"}``.

    Example::

        data = AudioDataset(root="clips", feature_extractor="facebook/wav2vec2-base")
        item = data[0]      # audio (samples,) float32 mono at data.sampling_rate;
                            # target: int (-1 without classes); file: relative path

    Raises:
        DataError: a root or path that does not exist or lists no sound files.
        ConfigError: neither or both of root and path, a missing column, a feature extractor
            that cannot be loaded, windows that do not fit together.
    """

    feed = AudioFeed()

    def __init__(self, root: str | None = None, path: str | None = None, column: str = "audio",
                 label_column: str | None = None, transcript_column: str | None = None,
                 feature_extractor: str | None = None,
                 window_seconds: float | None = None, stride_seconds: float | None = None):
        self.extractor_name = _required(feature_extractor)
        self.extractor = _extractor(self.extractor_name)
        self.sampling_rate = int(self.extractor.sampling_rate)
        if root is not None and path is None and transcript_column is not None:
            raise ConfigError("dataset.transcript_column is a column of dataset.path; a "
                              "dataset.root folder has none: list the clips in a csv")
        listing = listed("audio", root, path, _SUFFIXES, column, label_column,
                         {"transcript_column": transcript_column}, "sound files", "clips")
        self.transcripts = (None if transcript_column is None
                            else listing.texts.get(str(transcript_column)))
        self.source = str(root if root is not None else path)
        self.base, self.paths = listing.base, listing.paths
        self.targets, self.classes = listing.targets, listing.classes
        self.files = listing.files
        self.has_targets = self.targets is not None
        self.window_seconds, self.stride_seconds = _windows(window_seconds, stride_seconds)
        self._headers: list[tuple[int, int, int] | None] | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} clips")
        return {"audio": self.decode(index), "file": self.files[index],
                "target": -1 if self.targets is None else int(self.targets[index]),
                "transcript": None if self.transcripts is None else self.transcripts[index]}

    def decode(self, index: int) -> np.ndarray:
        """Clip ``index`` as float32 mono samples at ``sampling_rate``.

        Raises:
            DataError: a file that soundfile cannot read, or one without samples, naming it.
        """
        import soundfile
        import soxr

        try:
            sound, rate = soundfile.read(str(self.paths[index]), dtype="float32",
                                         always_2d=True)
        except Exception as err:  # libsndfile's errors: not audio, truncated, unknown format
            raise DataError(bad_sample(index, err, self.files[index])) from None
        if not len(sound):
            raise DataError(bad_sample(index, ValueError("it holds no samples"),
                                       self.files[index]))
        sound = sound.mean(axis=1) if sound.shape[1] > 1 else sound[:, 0]
        if rate != self.sampling_rate:
            sound = soxr.resample(sound, rate, self.sampling_rate).astype(np.float32)
        return np.ascontiguousarray(sound)

    def headers(self) -> list[tuple[int, int, int] | None]:
        """(samples, rate, channels) of each file from its header; None where it has none
        that soundfile reads (loading the clip then says why)."""
        if self._headers is None:
            import soundfile

            found = []
            for path in self.paths:
                try:
                    info = soundfile.info(str(path))
                    found.append((int(info.frames), int(info.samplerate), int(info.channels)))
                except Exception:  # said, naming the file, when the clip is loaded
                    found.append(None)
            self._headers = found
        return self._headers

    def lengths(self, indices: list[int]) -> np.ndarray:
        """Each clip's length in samples at ``sampling_rate``, from its header (soxr's
        length, rounded; 0 for a file without a header)."""
        headers = self.headers()
        return np.asarray([0 if headers[i] is None else
                           round(headers[i][0] * self.sampling_rate / headers[i][1])
                           for i in indices], dtype=np.int64)

    def describe(self) -> dict:
        """Root attrs that say how the files became clips."""
        rates = sorted({h[1] for h in self.headers() if h is not None})
        channels = sorted({h[2] for h in self.headers() if h is not None})
        attrs = {"feature_extractor": self.extractor_name, "sampling_rate": self.sampling_rate,
                 "source_sampling_rates": rates, "source_channels": channels,
                 "decoder": "soundfile", "resampler": "soxr", "mono": "mean of channels",
                 "resampled_files": sum(1 for h in self.headers()
                                        if h is not None and h[1] != self.sampling_rate)}
        if self.window_seconds is not None:
            attrs.update(window_seconds=self.window_seconds, stride_seconds=self.stride_seconds)
        return attrs

    def fingerprint(self) -> dict:
        """The files (relative paths and sizes) and the feature extractor's settings."""
        lines = sorted(f"{f}:{p.stat().st_size if p.exists() else -1}"
                       for f, p in zip(self.files, self.paths, strict=True))
        return {"audio_files": _digest("\n".join(lines)),
                "feature_extractor": _digest(self.extractor.to_json_string())}


def _required(value) -> str:
    if value is None or str(value) == "":
        raise ConfigError("dataset.feature_extractor is not set; set dataset.feature_extractor="
                          "<the model's name or folder> (dataset=audio sets it to model.name)")
    return str(value)


def _extractor(name: str):
    try:
        from transformers import AutoFeatureExtractor
    except ImportError:
        raise ConfigError("dataset=audio needs transformers: pip install 'probe[text,audio]'") \
            from None
    try:
        return AutoFeatureExtractor.from_pretrained(name)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"dataset.feature_extractor={name!r} cannot be loaded ({first}); "
                          "dataset=audio is read by an audio checkpoint's own feature "
                          "extractor: use a speech or audio model (wav2vec2, HuBERT, WavLM, "
                          "Whisper, AST)") from None


def _windows(window, stride) -> tuple[float | None, float | None]:
    if window is None:
        if stride is not None:
            raise ConfigError("dataset.stride_seconds without dataset.window_seconds; set both "
                              "to cut long recordings into windows")
        return None, None
    window = float(window)
    if not window > 0:
        raise ConfigError(f"dataset.window_seconds={window:g} must be above 0 (seconds of sound "
                          "per window), or null for whole clips")
    stride = window / 2 if stride is None else float(stride)
    if not 0 < stride <= window:
        raise ConfigError(f"dataset.stride_seconds={stride} must be above 0 and at most "
                          f"dataset.window_seconds={window}")
    return window, stride


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
