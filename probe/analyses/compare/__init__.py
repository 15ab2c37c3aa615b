"""Representational similarity between the stored keys of one file, or of two: linear CKA,
debiased CKA and RSA, computed out of core.

    result = compare("a.h5", "b.h5", metric="cka")   # Similarity: result.rows(), .matrix()
    python -m probe.compare file=a.h5 other=b.h5      # the same, plus similarity.csv and
                                                      # similarity.png (probe.commands.compare)

The rows of two files are matched by ``/index`` (only the samples both hold; runs of another
``limit``, ``subset``, shard or order pair up as far as they overlap). Rows per token pair up
when both files hold the same tokens of each shared document. CKA is computed from sums
streamed over blocks of rows (probe.analyses.compare.cka); RSA from RDMs of at most
``rdm_samples`` samples (probe.analyses.compare.rsa). Memory is bounded by ``memory_mb``,
whatever the size of the file.

The other side may be a brain instead (probe.analyses.compare.brain): ``rdm=`` RDMs (one, or
one per subject, which gives the noise ceiling) or ``responses=`` to make them from, their
stimuli matched to the file's rows by ``index=`` (default: dataset order). ``bootstrap=K``
draws the stimuli K times for an interval around every RSA value, and the rows K times around
every CKA value (probe.analyses.compare.cka_bootstrap).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import h5py
import numpy as np
import torch

from probe.analyses.compare.brain import (
    BrainRDMs,
    bootstrap_intervals,
    load_brain,
    noise_ceiling,
    spearman_mean,
    upper,
)
from probe.analyses.compare.cka import cka_matrix
from probe.analyses.compare.cka_bootstrap import cka_intervals
from probe.analyses.compare.config import CompareConfig as _Defaults
from probe.analyses.compare.pairing import Pairing, pair_rows
from probe.analyses.compare.rsa import ranked, rdm_upper, spearman_matrix, subset, upper_ranks
from probe.analyses.compare.rsa import rdm as model_rdm
from probe.analyses.stats import (
    AlignedRows,
    analysis_device,
    budget_bytes,
    match_index,
    select_keys,
    working_budget,
)
from probe.analyses.tables import aligned, beside, write_csv, writing
from probe.errors import ConfigError, DataError, OutputError
from probe.file.read import FeatureFile, open_checked

__all__ = ["compare", "Similarity", "write_similarity", "format_table", "default_out_dir",
           "METRICS", "COLUMNS"]

log = logging.getLogger(__name__)

COLUMNS = ("key_a", "key_b", "metric", "value")
INTERVAL = ("ci_low", "ci_high")  # bootstrap=K: the 95% percentile interval
CEILING = ("ceiling_lower", "ceiling_upper")  # per-subject RDMs: the noise ceiling


@dataclass
class Similarity:
    """The similarity of every key of ``file`` (``keys_a``) with every key of ``other``
    (``keys_b``; the same file's keys when ``other`` is None): ``values[(key_a, key_b)]``."""

    metric: str
    file: Path
    other: Path | None
    keys_a: list[str]
    keys_b: list[str]
    values: dict[tuple[str, str], float]
    samples: int  # the samples (documents) compared
    rows: int  # the rows compared: samples, tokens, or the rdm_samples subset
    notes: dict = field(default_factory=dict)  # how it was computed
    intervals: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    ceiling: tuple[float, float] | None = None  # (lower, upper), against per-subject RDMs

    def columns(self) -> tuple[str, ...]:
        """``COLUMNS``, then ``INTERVAL`` (bootstrap) and ``CEILING`` (subjects) if computed."""
        return (COLUMNS + (INTERVAL if self.intervals else ())
                + (CEILING if self.ceiling else ()))

    def table(self) -> list[dict]:
        """One dict per pair, with the keys of ``columns()``, ``keys_a`` by ``keys_b``."""
        rows = []
        for a in self.keys_a:
            for b in self.keys_b:
                row = {"key_a": a, "key_b": b, "metric": self.metric,
                       "value": self.values[(a, b)]}
                if self.intervals:
                    row.update(zip(INTERVAL, self.intervals[(a, b)], strict=True))
                if self.ceiling:
                    row.update(zip(CEILING, self.ceiling, strict=True))
                rows.append(row)
        return rows

    def matrix(self) -> np.ndarray:
        """(len(keys_a), len(keys_b)) values."""
        return np.array([[self.values[(a, b)] for b in self.keys_b] for a in self.keys_a])


def compare(path: str | Path, other: str | Path | None = _Defaults.other,
            keys: list[str] | None = _Defaults.keys,
            other_keys: list[str] | None = _Defaults.other_keys,
            metric: str | None = _Defaults.metric, *,
            rdm_samples: int | None = _Defaults.rdm_samples,
            rdms: str | Path | None = None, seed: int = _Defaults.seed,
            rdm: str | None = _Defaults.rdm, responses: str | None = _Defaults.responses,
            index: str | None = _Defaults.index, bootstrap: int = _Defaults.bootstrap,
            device: str = _Defaults.device, memory_mb: float = _Defaults.memory_mb,
            accumulate: str = _Defaults.accumulate,
            pair_anyway: bool = _Defaults.pair_anyway) -> Similarity:
    """Compare every stored key of ``path`` with every other one, or with every key of
    ``other``.

    The defaults are those of ``python -m probe.compare`` (probe.analyses.compare.config).

    Args:
        path: a finished probe file.
        other: a second one, its rows matched to ``path``'s by ``/index``; None to compare the
            keys of ``path`` among themselves.
        keys: "<layer>/<kind>"s or "<layer>"s of ``path``; None for every stored dataset.
        other_keys: the same for ``other``; None for the names of ``keys`` (or every dataset).
        metric: ``cka``, ``cka_debiased`` or ``rsa``; None: ``rsa`` against a brain,
            else ``cka``.
        rdm_samples: rsa: the most samples an RDM is made of (a subset drawn with ``seed``).
        rdms: rsa: an HDF5 file to write the RDMs to, or None.
        seed: draws the ``rdm_samples`` subset and the bootstrap samples.
        rdm: instead of ``other``, the brain's RDMs: a ``.npy`` file or ``F.h5:name`` of
            (N, N), (S, N, N) for S subjects, or condensed (N(N-1)/2,) or (S, N(N-1)/2).
        responses: instead of ``rdm``, (N, F) or (S, N, F) responses to make them from
            (1 - Pearson r).
        index: ``.npy`` of the dataset sample of each of the brain's N stimuli; None for
            dataset order (stimulus i is sample i).
        bootstrap: draw the stimuli (cka: the rows) this many times with replacement for a
            95% interval of each value (``Similarity.intervals``); 0 for none.
        device: where the sums are made (``cpu``, ``cuda``, ``auto``, ...).
        memory_mb: MiB for the rows and sums held at once.
        accumulate: cka: ``auto``, ``features`` or ``gram`` (see probe.analyses.compare.cka).
        pair_anyway: pair the rows of two files made from different datasets (their data
            fingerprints differ) by /index all the same; the result's notes say so.

    Returns:
        The ``Similarity`` of every pair.

    Raises:
        ProbeError: a file is missing or unfinished, lacks a key, or the files share no
            sample; or a bad option (named, with what to use instead).
    """
    brain = None
    if rdm is not None or responses is not None:
        if other is not None:
            raise ConfigError("other= and rdm=/responses= both name the other side; give one")
        if metric not in (None, "rsa"):
            raise ConfigError(f"rdm= and responses= are compared by RSA, not metric={metric}; "
                              "leave metric out or use metric=rsa")
        brain = load_brain(rdm, responses, index)
    elif index is not None:
        raise ConfigError("index= matches a brain's stimuli to the file's rows; it goes with "
                          "rdm= or responses=")
    metric = metric or ("rsa" if brain is not None else "cka")
    if metric not in METRICS:
        raise ConfigError(f"metric={metric!r}: use {', '.join(METRICS[:-1])} or {METRICS[-1]}")
    if int(bootstrap) < 0:
        raise ConfigError(f"bootstrap={bootstrap}: a number of bootstrap samples (0 for none)")
    if rdm_samples is not None and int(rdm_samples) < 3:
        raise ConfigError(f"rdm_samples={rdm_samples} must be at least 3, or null for all")
    budget = budget_bytes(memory_mb)
    torch_device = analysis_device(device)
    with open_checked(path) as fa:
        keys_a = select_keys(fa, keys)
        if brain is not None:
            return _brain_rsa(fa, keys_a, brain, rdm_samples, seed, budget, int(bootstrap),
                              torch_device, rdms, {"device": str(torch_device),
                                                   "memory_mb": float(memory_mb)})
        second = None if other is None else open_checked(other)
        try:
            keys_b = keys_a if second is None else select_keys(
                second, other_keys if other_keys is not None else (
                    keys if keys is None else keys_a), name="other_keys")
            pairing = pair_rows(fa, keys_a, second, keys_b, anyway=bool(pair_anyway))
            reader = _reader(fa, keys_a, second, keys_b, pairing, torch_device)
            left = [f"a:{k}" for k in keys_a]
            right = left if second is None else [f"b:{k}" for k in keys_b]
            notes: dict = {"device": str(torch_device), "memory_mb": float(memory_mb)}
            if pairing.anyway:
                notes["paired_anyway"] = pairing.anyway
            asked = _Asked(seed, budget, int(bootstrap), rdm_samples, rdms, accumulate, notes)
            values, rows, intervals = _METRICS[metric](reader, left, right, pairing, asked,
                                                       (fa, second))
        finally:
            if second is not None:
                second.close()
    result = Similarity(metric, Path(path), None if other is None else Path(other), keys_a,
                        keys_b, {(a[2:], b[2:]): v for (a, b), v in values.items()},
                        pairing.samples, rows, notes,
                        {(a[2:], b[2:]): v for (a, b), v in intervals.items()})
    log.info("%s of %d x %d keys over %d %s", metric, len(keys_a), len(keys_b), rows,
             "token rows" if pairing.per_token else "samples")
    return result


def _reader(fa: FeatureFile, keys_a: list[str], fb: FeatureFile | None, keys_b: list[str],
            pairing: Pairing, device) -> AlignedRows:
    sources = {f"a:{k}": (fa, k) for k in keys_a}
    rows = dict.fromkeys(sources, pairing.rows_a)
    if fb is not None:
        sources.update({f"b:{k}": (fb, k) for k in keys_b})
        rows.update(dict.fromkeys((f"b:{k}" for k in keys_b), pairing.rows_b))
    return AlignedRows(sources, rows, device)


@dataclass(frozen=True)
class _Asked:
    """What ``compare`` was asked, as every metric reads it; ``notes`` say how the result was
    made (a metric adds its own)."""

    seed: int
    budget: int
    bootstrap: int
    rdm_samples: int | None
    rdms: str | Path | None
    accumulate: str
    notes: dict


Files = tuple[FeatureFile, FeatureFile | None]


def _cka(reader: AlignedRows, left: list[str], right: list[str], pairing: Pairing,
         asked: _Asked, files: Files, *, debiased: bool):
    values = cka_matrix(reader, left, right, debiased=debiased, budget=asked.budget,
                        accumulate=asked.accumulate)
    intervals = {}
    if asked.bootstrap:
        log.info("%s: %d bootstrap samples of the %d rows (seed=%d)",
                 "cka_debiased" if debiased else "cka", asked.bootstrap, reader.num_rows,
                 asked.seed)
        intervals = cka_intervals(reader, left, right, debiased=debiased, budget=asked.budget,
                                  samples=asked.bootstrap, seed=asked.seed)
    return values, reader.num_rows, intervals


def _rsa(reader: AlignedRows, left: list[str], right: list[str], pairing: Pairing,
         asked: _Asked, files: Files):
    rdm_samples, seed, budget, rdms = asked.rdm_samples, asked.seed, asked.budget, asked.rdms
    (fa, fb), notes, bootstrap = files, asked.notes, asked.bootstrap
    if reader.num_rows < 3:
        raise ConfigError(f"rsa needs at least 3 samples shared by both sides, and there are "
                          f"{reader.num_rows}")
    positions = _subset_or_all(reader.num_rows, rdm_samples, seed,
                               "token rows" if pairing.per_token else "samples")
    sub = reader.subset(positions)
    n = len(positions)
    triangle = 8 * n * (n - 1) // 2
    names = list(dict.fromkeys([*left, *right]))
    if bootstrap and 8 * n * n * len(names) + 4 * triangle > budget:
        need = (8 * n * n * len(names) + 4 * triangle) / (1 << 20)
        raise ConfigError(f"bootstrap holds the {len(names)} RDMs of {n} samples at once, about "
                          f"{need:.2g} MiB, more than memory_mb={notes['memory_mb']:g}; lower "
                          "rdm_samples or raise memory_mb")
    if 8 * n * n + 4 * triangle > budget:
        need = (8 * n * n + 4 * triangle) / (1 << 20)
        raise ConfigError(f"an RDM of {n} samples needs about {need:.2g} MiB, more than "
                          f"memory_mb={notes['memory_mb']:g}; lower rdm_samples or raise "
                          "memory_mb")
    # the ranked triangles of as many keys as the budget holds beside one RDM; the others are
    # made again when needed. The right side's, and the left key in hand, are all that the loop
    # over pairs reuses: when they fit, they go into one block of memory made first (ranks made
    # one by one, between the temporaries of the next RDM, fragment the heap), and the key
    # evicted, whose slot is reused, is always a left key done with
    cache: OrderedDict = OrderedDict()
    room = max(2, (budget - 8 * n * n) // max(1, triangle))
    slots = None
    if room > len(right):
        room = len(right) + 1
        slots = torch.empty(room, n * (n - 1) // 2, dtype=torch.float64, device=sub.device)
    # each RDM is made in what the kept ranks and the libraries' own buffers leave
    rdm_budget = working_budget(budget) - room * triangle
    writer = _RdmWriter(rdms, fa, fb, pairing.index[positions], sub.rows) if rdms else None
    kept: dict = {}  # bootstrap: every RDM, (1, N, N)

    def ranks_of(name: str):
        if name not in cache:
            evicted = cache.popitem(last=False)[1] if len(cache) == room else None
            out = None if slots is None else slots[len(cache)] if evicted is None else evicted
            if bootstrap or writer is not None:  # the whole matrices
                matrix = model_rdm(sub, name, rdm_budget)
                if bootstrap:
                    kept[name] = matrix[None]
                if writer is not None:
                    writer.add(name, matrix)
                ranks = upper_ranks(matrix)
                del matrix
                cache[name] = ranks if out is None else out.copy_(ranks)
            else:  # the upper triangle alone, made in blocks
                cache[name] = ranked(rdm_upper(sub, name, rdm_budget, out=out))
        cache.move_to_end(name)
        return cache[name]

    try:
        values = spearman_matrix(left, right, ranks_of)
    finally:
        if writer is not None:
            notes["rdms"] = str(writer.close())
    notes["rdm_samples"] = n
    intervals = {}
    if bootstrap:
        log.info("rsa: %d bootstrap samples of the %d stimuli (seed=%d)", bootstrap, n, seed)
        intervals = bootstrap_intervals(kept, kept, [(a, b) for a in left for b in right],
                                        bootstrap, seed)
    return values, n, intervals


# each metric by its name in metric=: (the rows, the left and right keys, how the rows pair,
# what was asked, the files) -> (the value of each pair, the rows used, intervals)
_METRICS = {"cka": partial(_cka, debiased=False), "cka_debiased": partial(_cka, debiased=True),
            "rsa": _rsa}
METRICS = tuple(_METRICS)


def _brain_rsa(fa: FeatureFile, keys: list[str], brain: BrainRDMs, rdm_samples: int | None,
               seed: int, budget: int, bootstrap: int, device, rdms: str | Path | None,
               notes: dict) -> Similarity:
    # RSA of every key of the file against the brain's RDMs, on the stimuli both hold
    if pair_rows(fa, keys).per_token:
        raise ConfigError("rdm= and responses= hold one row per stimulus, and these keys hold "
                          "rows per token; store the layers with tokens=mean or tokens=last")
    rows, stimuli = match_index(fa.index, brain.index)
    if len(rows) < 3:
        raise DataError(f"the file and {brain.name} share {len(rows)} samples: the file's "
                        f"/index holds {len(fa.index)} samples, the brain's stimuli "
                        f"{len(brain.index)}; RSA needs at least 3 (index= maps the stimuli "
                        "to dataset samples)")
    positions = _subset_or_all(len(rows), rdm_samples, seed)
    rows, stimuli = rows[positions], stimuli[positions]
    n = len(rows)
    log.info("rsa against %s: %d stimuli matched by /index, %d subject(s)", brain.name, n,
             brain.subjects)
    if 8 * n * n * (2 + brain.subjects + (len(keys) if bootstrap else 0)) > budget:
        raise ConfigError(f"the RDMs of {n} stimuli need more than memory_mb="
                          f"{notes['memory_mb']:g}; lower rdm_samples or raise memory_mb")
    pick = torch.from_numpy(stimuli)
    target = torch.from_numpy(brain.matrices).to(device)[:, pick][:, :, pick]
    target_upper = upper(target)
    names = [f"a:{k}" for k in keys]
    reader = AlignedRows({name: (fa, k) for name, k in zip(names, keys, strict=True)},
                         dict.fromkeys(names, rows), device)
    writer = _RdmWriter(rdms, fa, None, fa.index[rows], reader.rows) if rdms else None
    values, kept = {}, {}
    try:
        for name in names:
            matrix = model_rdm(reader, name, budget)
            if writer is not None:
                writer.add(name, matrix)
            values[(name[2:], brain.name)] = spearman_mean(upper(matrix), target_upper)
            if bootstrap:
                kept[name[2:]] = matrix[None]
    finally:
        if writer is not None:
            notes["rdms"] = str(writer.close())
    ceiling = noise_ceiling(target_upper) if brain.subjects > 1 else None
    intervals = {}
    if bootstrap:
        log.info("rsa: %d bootstrap samples of the %d stimuli (seed=%d)", bootstrap, n, seed)
        intervals = bootstrap_intervals(kept, {brain.name: target},
                                        [(k, brain.name) for k in keys], bootstrap, seed)
    notes.update(rdm_samples=n, subjects=brain.subjects)
    return Similarity("rsa", fa.path, None, keys, [brain.name], values, n, n, notes,
                      intervals, ceiling)


def _subset_or_all(count: int, rdm_samples: int | None, seed: int,
                   rows: str = "matched stimuli") -> np.ndarray:
    # the rdm_samples subset of count rows, said in the log when it leaves rows out
    positions = subset(count, rdm_samples, seed)
    if len(positions) < count:
        log.info("rsa: RDMs of %d of the %d %s, drawn with seed=%d (rdm_samples=%d)",
                 len(positions), count, rows, seed, rdm_samples)
    return positions


class _RdmWriter:
    """rdms.h5: ``index`` (each RDM row's dataset sample), ``file/<layer>/<kind>`` and
    ``other/<layer>/<kind>`` (N, N) float32, attrs saying how they were made."""

    def __init__(self, path: str | Path, fa: FeatureFile, fb: FeatureFile | None,
                 index: np.ndarray, rows: dict[str, np.ndarray]):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = h5py.File(self.path, "w")
        except OSError as err:
            raise OutputError(f"cannot write {str(self.path)!r} ({err.strerror or err}); "
                              "choose a writable out_dir") from None
        self.file.attrs.update({
            "dissimilarity": "1 - Pearson r between samples (rsatoolbox method='correlation')",
            "file": str(fa.path), "other": "" if fb is None else str(fb.path)})
        self.file["index"] = index
        self.rows = rows
        self.written: set[str] = set()

    def add(self, name: str, matrix) -> None:
        if name in self.written:
            return
        side, key = ("file" if name.startswith("a:") else "other"), name[2:]
        self.file.create_dataset(f"{side}/{key}", data=matrix.cpu().numpy().astype(np.float32))
        self.file[f"{side}/{key}"].attrs["rows"] = self.rows[name]
        self.written.add(name)

    def close(self) -> Path:
        self.file.close()
        return self.path


def default_out_dir(path: str | Path) -> Path:
    """``<file's folder>/<file stem>_compare``: where ``python -m probe.compare`` writes."""
    return beside(path, "compare")


def write_similarity(result: Similarity, out_dir: str | Path) -> Path:
    """Write ``similarity.csv`` (columns ``COLUMNS``) into ``out_dir``, and beside it
    ``compared.json``: what was compared with what, over which samples, and how (the notes:
    files paired although their data differ, say); return the table's path.

    Raises:
        OutputError: ``out_dir`` cannot be written.
    """
    with writing(out_dir) as out:
        said = {"metric": result.metric, "file": str(result.file),
                "other": None if result.other is None else str(result.other),
                "keys_a": result.keys_a, "keys_b": result.keys_b, "samples": result.samples,
                "rows": result.rows, "notes": result.notes}
        (out / "compared.json").write_text(json.dumps(said, indent=1, default=str) + "\n")
        return write_csv(out / "similarity.csv", result.columns(), result.table())


def format_table(result: Similarity) -> str:
    """The values as an aligned text matrix: a row per key of ``file``, a column per key of
    ``other`` (or of ``file``)."""
    return aligned([[result.metric, *result.keys_b]]
                   + [[a, *(f"{result.values[(a, b)]:.3f}" for b in result.keys_b)]
                      for a in result.keys_a])
