"""What interventions read from disk: a steering vector (a .npy file, or a key of a probe file),
the mean of a probe file's rows of a key (mean ablation), and a probe file's rows of each sample
of a batch (patching). Every value is read once per run (the vector, the mean) or once per
batch (the patched rows), never the whole file into memory; each says what it is, so that the
file records it and a run with another never resumes into it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from probe.errors import ConfigError, ProbeError
from probe.file.format import GENERATED, POSITIONS, Attr
from probe.file.read import FeatureFile
from probe.file.recorded import changes, loads

__all__ = ["Row", "read_vector", "mean_row", "PatchSource"]

_READ_ROWS = 1 << 14  # rows read at a time for a mean: a few MB of a wide layer


@dataclass(frozen=True)
class Row:
    """One row to apply (a vector, a mean), and what it was read from, as the file records."""

    value: torch.Tensor  # float32
    said: dict = field(default_factory=dict)


def read_vector(where: str, spec: str) -> Row:
    """The vector of ``spec``: a .npy file of one row, or ``<file>.h5:<key>`` (a dataset of one
    row, or a probe file's key: the mean of its rows).

    Raises:
        ConfigError: no such file or key, or not one row.
    """
    path, colon, key = spec.partition(".h5:")
    if colon:
        return mean_row(where, path + ".h5", key, what="vector")
    if not Path(spec).is_file():
        raise ConfigError(f"{where}: vector {spec!r} does not exist; give a .npy file of one "
                          "row, or <probe file>.h5:<key>")
    try:
        value = np.load(spec, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: vector {spec!r} is not a .npy array ({err})") from None
    if value.ndim == 2 and value.shape[0] == 1:
        value = value[0]
    if value.dtype.kind not in "fiu" or value.ndim == 0:
        raise ConfigError(f"{where}: vector {spec!r} holds {value.dtype} of shape "
                          f"{value.shape}; give one row of numbers")
    return _row(value, {"vector": spec})


def mean_row(where: str, path: str, key: str, *, what: str = "from") -> Row:
    """The mean of the rows of ``key`` in the probe file at ``path`` (a dataset that is one row
    already, not a probe run's rows, is taken as it is), summed in float64 a block at a time.

    Raises:
        ConfigError: no such file or key.
    """
    with _opened(where, path, what) as f:
        dataset = _require(where, f, key, path)
        if Attr.LAYER not in dataset.attrs:  # a plain array of one row (a direction of yours)
            value = np.asarray(dataset[()])
        else:
            total, count = np.zeros(dataset.shape[1:], np.float64), len(dataset)
            if count == 0:
                raise ConfigError(f"{where}: {key!r} in {path!r} holds no rows to average")
            for start in range(0, count, _READ_ROWS):
                total += np.asarray(dataset[start:start + _READ_ROWS], np.float64).sum(0)
            value = total / count
        said = {what: path, "key": key, **_file_identity(f)}
    return _row(value, said)


def _row(value: np.ndarray, said: dict) -> Row:
    row = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
    digest = hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16]
    return Row(row, {**said, "shape": list(row.shape), "sha256": digest})


class PatchSource:
    """A probe file's rows of one key, read per batch by dataset index: each sample's token
    rows (as its positions, from 0), or its one row.

    Raises (on construction):
        ConfigError: the file is of another model, lacks the key, stores it pooled, or stores
            token rows that are not every position from 0.
    """

    def __init__(self, where: str, path: str, key: str, model_fingerprint: dict):
        self.where, self.path, self.key = where, path, key
        self._file = _open(where, path, "from")
        try:
            dataset = _require(where, self._file, key, path)
            stored = loads(self._file.attrs.get(Attr.MODEL_FINGERPRINT))
            differ = [] if stored is None else changes(stored, model_fingerprint)
            if differ:
                raise ConfigError(f"{where}: {path!r} was written by another model "
                                  f"({'; '.join(differ)}); patch from a run of the same model")
            reduce = dataset.attrs.get(Attr.REDUCE, "none")
            tokens = self._file.attrs.get(Attr.TOKENS, "all")
            if reduce != "none" or tokens not in ("all",):
                raise ConfigError(f"{where}: {key!r} in {path!r} is stored pooled "
                                  f"(reduce={reduce}, tokens={tokens}); patch from a run with "
                                  "reduce=none tokens=all")
            self.per_token = self._file.per_token(key)
            if self.per_token:
                _require_every_position(where, self._file, path)
            # its samples hold answer rows after their prompt's: said where lengths differ
            self.generated = GENERATED in self._file
            self.samples = self._file.num_rows
            self.row_shape = tuple(dataset.shape[1:])
            self.said = {"from": path, "key": key, **_file_identity(self._file)}
        except BaseException:
            self._file.close()
            raise

    def rows(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of the samples ``index`` (dataset indices): (B, longest, *row) for token
        rows (zeros after each sample's own), or (B, *row), and each sample's count of rows.

        Raises:
            ConfigError: a sample that the file does not hold.
        """
        samples = []
        for i in index.tolist():
            try:
                samples.append(np.asarray(self._file.rows_of(self.key, int(i)), np.float32))
            except KeyError:
                raise ConfigError(f"{self.where}: sample {i} is not in {self.path!r}; patch "
                                  "from a run over the same samples (the same limit, subset "
                                  "and shard)") from None
        counts = torch.tensor([len(s) if self.per_token else 1 for s in samples])
        if not self.per_token:
            return torch.from_numpy(np.stack(samples)), counts
        rows = torch.zeros((len(samples), int(counts.max()), *self.row_shape))
        for n, sample in enumerate(samples):
            rows[n, :len(sample)] = torch.from_numpy(sample)
        return rows, counts

    def close(self) -> None:
        self._file.close()


def _require_every_position(where: str, f: FeatureFile, path: str) -> None:
    """A sample's token rows are placed by their order (row k at position k): refuse a file
    whose rows are not every position from 0 (a run that stored the answer's alone, or left
    special tokens out), read a block of /positions at a time."""
    offsets = f.offsets
    if POSITIONS not in f or offsets is None:
        return
    positions = f[POSITIONS]
    for start in range(0, int(offsets[-1]), _READ_ROWS):
        rows = np.arange(start, min(start + _READ_ROWS, int(offsets[-1])))
        sample = np.searchsorted(offsets, rows, side="right") - 1
        wrong = np.flatnonzero(positions[rows[0]:rows[-1] + 1] != rows - offsets[sample])
        if len(wrong):
            row, n = int(rows[wrong[0]]), int(sample[wrong[0]])
            raise ConfigError(
                f"{where}: {path!r} stores row {row - int(offsets[n])} of sample "
                f"{int(f.index[n])} at position {int(positions[row])}: its rows are not every "
                "position from 0 (a run with generate.rows=answer, or dataset.exclude_special="
                "true); patch from a run that stores them all (generate.rows=all, or no "
                "generation, with dataset.exclude_special=false)")


def _file_identity(f: FeatureFile) -> dict:
    # what makes a file the one a run read: when it was written, and from what
    return {"created": str(f.attrs.get("created", "")),
            "data_fingerprint": hashlib.sha256(
                str(f.attrs.get(Attr.DATA_FINGERPRINT, "")).encode()).hexdigest()[:16]}


def _open(where: str, path: str, what: str) -> FeatureFile:
    try:
        return FeatureFile(path, label=f"{where}: {what} ")
    except ProbeError as err:
        raise ConfigError(str(err)) from None


class _opened:
    def __init__(self, where: str, path: str, what: str):
        self.file = _open(where, path, what)

    def __enter__(self) -> FeatureFile:
        return self.file

    def __exit__(self, *exc_info) -> None:
        self.file.close()


def _require(where: str, f: FeatureFile, key: str, path: str):
    try:
        return f[key]
    except KeyError:
        held = ", ".join(f.features) or "no layer"
        layer, kind = key.rsplit("/", 1)
        hooks = " hooks=[forward_pre]" if kind == "input" else ""
        raise ConfigError(f"{where}: {path!r} holds no {key!r} (it holds {held}); store it "
                          f"first with a run of layers=[{layer}]{hooks}") from None
