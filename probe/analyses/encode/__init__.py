"""Encoding models: how well a cross-validated ridge regression from each stored key predicts
every column of a target array (brain or behavioural responses, one row per dataset sample).

    results = encode("features.h5", "bold.npy")        # [{"key", "score", "r", ...}, ...]
    python -m probe.encode file=features.h5 targets=bold.npy   # plus encoding.csv, scores.h5
                                                       # and encoding.png (probe.commands.encode)

Row i of the targets belongs to dataset sample i: each row of the file is paired with the
targets' row ``/index[row]``. ``score`` is the mean over the target columns of the held-out
Pearson r (each column's r averaged over the outer folds). The scheme is in
probe.analyses.encode.ridge. ``solver=auto`` solves it exactly, with one eigendecomposition per
training set for every alpha and target: from sums streamed over blocks of rows (XᵀX, features
x features) where a key has fewer features than training rows, else in the kernel form
(probe.analyses.encode.kernel: the rows' Gram matrix, rows x rows) where that fits in
``memory_mb``; ``solver=himalaya`` runs himalaya's RidgeCV on the same folds. Rows wider
than ``max_features`` are first reduced by a seeded sparse random projection
(probe.analyses.encode.projection), recorded in scores.h5. With ``tr``, the rows are a
time series placed in the targets' TRs, run by run (probe.analyses.encode.timeline: the
file's /onset or onsets by hand, runs= per /file, hrf=), and the folds are contiguous blocks
or whole runs.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from probe.analyses.encode.bands import banded_bytes, solve_banded
from probe.analyses.encode.ceiling import Repeats, normalised, open_repeats
from probe.analyses.encode.config import ALPHAS
from probe.analyses.encode.config import EncodeConfig as _Defaults
from probe.analyses.encode.design import (
    Delayed,
    Design,
    FileRows,
    check_time_series,
    checked_delays,
)
from probe.analyses.encode.hrf import checked_hrf
from probe.analyses.encode.kernel import kernel_bytes, solve_kernel
from probe.analyses.encode.projection import SparseProjection
from probe.analyses.encode.ridge import (
    FoldAccumulator,
    check_folds,
    deal_folds,
    have_himalaya,
    himalaya_bytes,
    solve_in_memory,
    solve_streamed,
    stats_bytes,
)
from probe.analyses.encode.targets import Targets, open_targets
from probe.analyses.encode.timeline import Timeline, open_timeline
from probe.analyses.stats import (
    analysis_device,
    blocks_of,
    budget_bytes,
    memory_mb_for,
    row_width,
    select_keys,
    working_budget,
)
from probe.analyses.tables import aligned, beside, write_csv, writing
from probe.errors import ConfigError
from probe.file.read import FeatureFile, open_checked

__all__ = ["encode", "write_results", "format_table", "default_out_dir", "COLUMNS", "SOLVERS"]

log = logging.getLogger(__name__)

COLUMNS = ("key", "score")


def encode(path: str | Path, targets: str | Path | None, keys: list[str] | None =
           _Defaults.keys, *, folds: int = _Defaults.folds, alphas: list[float] | None = None,
           max_features: int = _Defaults.max_features, seed: int = _Defaults.seed,
           device: str = _Defaults.device, memory_mb: float = _Defaults.memory_mb,
           solver: str = _Defaults.solver, delays: list[int] | None = None,
           tr: float | None = None, onsets: str | Path | None = None,
           runs: str | Path | None = None, hrf: str | None = None,
           repeats: str | Path | None = None, bands: list[str] | None = None) -> list[dict]:
    """Fit and test a cross-validated ridge encoding model per stored key.

    The defaults are those of ``python -m probe.encode`` (probe.analyses.encode.config).

    Args:
        path: a finished probe file with one row per sample.
        targets: ``T.npy`` (N, V) or ``T.h5:name``; row i belongs to dataset sample i (or,
            with ``tr``, to TR i). None with ``repeats``: their mean.
        keys: "<layer>/<kind>"s or "<layer>"s; None for every stored dataset.
        folds: outer folds (at least 3; the inner search uses the others).
        alphas: the penalties to choose from per target; None for
            probe.analyses.encode.config.ALPHAS.
        max_features: wider rows are projected to this many features first.
        seed: deals the folds and draws the projection.
        device: where the ridge is solved (``cpu``, ``cuda``, ``auto``).
        memory_mb: MiB for the rows and sums held at once.
        solver: ``auto`` (exact, the cheaper of the streamed sums and the kernel form),
            ``streamed``, ``kernel`` or ``himalaya``.
        delays: a finite impulse response: each row beside the rows that many rows (TRs)
            before it (never from the run before); the rows are then a time series, and the
            folds contiguous blocks of it (whole runs, where there are ``folds`` runs).
        tr: seconds per TR: the targets' rows are TRs, and the stored rows are placed in time
            and averaged into them (probe.analyses.encode.timeline), by the file's ``/onset``
            unless ``onsets`` are given.
        onsets: ``O.npy``, each sample's onset in seconds (or each stored row's), instead of
            the file's ``/onset``.
        runs: ``R.npy``, each targets row's run (fMRI run): 0 .. F - 1, the files in the
            order they first appear in the dataset, or their ``/file`` names. Each file's
            rows go into its run's TRs, from its start; needed where the rows are of
            several files (probe.analyses.encode.runs).
        hrf: ``spm`` or ``glover``: the TRs' features convolved with nilearn's haemodynamic
            response, within each run (probe.analyses.encode.hrf); with ``delays``, the
            delays are of the convolved rows. Needs ``tr``.
        repeats: ``R.npy`` (R, N, V), repeated responses: each target's noise ceiling
            (probe.analyses.encode.ceiling), and the scores normalised by it.
        bands: two or more keys for one more model, a banded ridge across them
            (probe.analyses.encode.bands; needs himalaya), after the models of ``keys``.

    Returns:
        One dict per key, in the model's order: ``key``, ``score``, ``r`` (V,) each column's
        r, ``fold_r`` and ``alpha`` (folds, V), and how it was solved (``solver``,
        ``features``, and the projection's ``input_features``, ``projection``, ... where one
        was made); ``design``, the time series' options where there are some (``delays``,
        ``tr``, ``onsets``, ``hrf``, ``runs`` and ``run_trs``, ``folds_by``); with
        ``repeats``, ``score_normalised``, ``r_normalised`` and
        ``reliability`` too. The banded model's ``key`` joins its bands' with ``+``; it has
        ``bands`` and ``band_weights`` (folds, bands, V).

    Raises:
        ProbeError: the file or targets are missing or unfinished, a key is not in the file
            or holds rows per token (without ``tr``), the targets have another number of rows
            than the dataset has samples, ``tr`` over a file without ``/onset`` and no
            ``onsets``, rows of several files without ``runs``; or a bad option (named, with
            what to use instead).
    """
    alphas = _checked_alphas(ALPHAS if alphas is None else alphas)
    if solver not in SOLVERS:
        raise ConfigError(f"solver={solver!r}: use {', '.join(SOLVERS[:-1])} or {SOLVERS[-1]}")
    if int(max_features) < 1:
        raise ConfigError(f"max_features={max_features} must be at least 1")
    for module in _SOLVERS[solver].needs if solver != "auto" else ():
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"solver={solver} needs {module}: pip install "
                              "'probe[analysis]', or use solver=streamed")
    delays = None if delays is None else checked_delays(delays)
    tr, hand_onsets = _checked_timing(tr, onsets, runs)
    hrf = checked_hrf(hrf, tr)
    budget = working_budget(budget_bytes(memory_mb))
    torch_device = analysis_device(device)
    with ExitStack() as stack:
        f = stack.enter_context(open_checked(path))
        repeated = _opened_repeats(repeats, stack)
        target = stack.enter_context(_opened_targets(targets, repeated, budget))
        selected = select_keys(f, keys)
        timeline = None
        if tr is None:
            token_rows = [key for key in selected if f.per_token(key)]
            if token_rows:
                raise ConfigError(
                    f"{', '.join(token_rows)} hold one row per token (tokens=all), and the "
                    "targets one row per sample; run probe with tokens=last or tokens=mean, or "
                    "place the rows in time with tr= (and onsets=, where the file has no "
                    "/onset)")
            target.check_rows_of(f)
        else:
            timeline = open_timeline(f, tr, hand_onsets, runs, hrf, target.num_rows,
                                     onsets_from=None if onsets is None else str(onsets))
        num_rows = target.num_rows if timeline is not None else f.num_rows
        check_folds(folds, num_rows)
        fold_of, folds_by = _folds(timeline, delays, num_rows, int(folds), int(seed))
        banded = _checked_bands(f, bands, num_rows, target.num_columns, budget)
        described = _described(timeline, delays, folds_by)

        def design_of(key: str) -> tuple[Design, SparseProjection | None]:
            return _design(f, key, target, int(max_features), int(seed), torch_device,
                           budget, delays, timeline)

        results = []
        for key in selected:
            design, projection = design_of(key)
            found = _solve(key, design, target, fold_of, alphas, budget, solver)
            if projection is not None:
                found.update(projection.describe())
            if described:
                found["design"] = described
            results.append(found)
            _log_score(found)
        if banded:
            designs = [design_of(key)[0] for key in banded]
            results.append(_solve_bands(banded, designs, target, fold_of, alphas, int(seed),
                                        budget))
            if described:
                results[-1]["design"] = described
            _log_score(results[-1])
        if repeated is not None:  # over the targets' rows that the models were tested on
            tested = np.arange(target.num_rows) if timeline is not None else f.index
            reliability = repeated.reliability(tested, budget)
            for found in results:
                found["reliability"] = reliability
                found["r_normalised"] = normalised(found["r"], reliability)
                found["score_normalised"] = _nanmean(found["r_normalised"])
    return results


def _log_score(found: dict) -> None:
    log.info("%s: score %.3f (%s, %d features%s)", found["key"], found["score"],
             found["solver"], found["features"],
             f", projected from {found['input_features']}" if "projection" in found else "")


def _checked_bands(f: FeatureFile, bands, rows: int, columns: int, budget: int
                   ) -> list[str]:
    if bands is None:
        return []
    chosen = select_keys(f, bands, name="bands")
    if len(chosen) < 2:
        raise ConfigError(f"bands={list(bands)} names {len(chosen)} dataset; a banded ridge "
                          "weighs two or more keys, e.g. 'bands=[layer3,layer4]'")
    if not have_himalaya():
        raise ConfigError("bands= needs himalaya: pip install 'probe[analysis]'")
    need = banded_bytes(len(chosen), rows, columns)
    if need > budget:
        raise ConfigError(f"bands= holds {len(chosen)} Gram matrices of {rows} x {rows} rows, "
                          f"about {need / (1 << 20):.0f} MiB, more than memory_mb allows; "
                          "raise memory_mb")
    return chosen


def _solve_bands(keys: list[str], designs: list[Design], target: Targets,
                 fold_of: np.ndarray, alphas: list[float], seed: int, budget: int) -> dict:
    grams = torch.stack([_gram(design, budget // (2 * len(designs)) or 1)
                         for design in designs])
    y = target.rows(designs[0].index)
    r, chosen, weights = solve_banded(grams, y, fold_of, alphas, seed)
    del grams
    return {"key": "+".join(keys), "score": float(r.mean(0).mean()), "r": r.mean(0),
            "fold_r": r, "alpha": chosen, "solver": "banded", "bands": keys,
            "band_weights": weights, "features": sum(d.features for d in designs)}


def _checked_alphas(alphas) -> list[float]:
    values = [float(a) for a in alphas]
    if not values or min(values) <= 0:
        raise ConfigError(f"alphas={values} must be one or more positive penalties, e.g. "
                          "'alphas=[1,10,100]'")
    return sorted(set(values))


def _checked_timing(tr, onsets, runs) -> tuple[float | None, np.ndarray | None]:
    # tr, and the onsets given by hand (None: the file's own /onset, read with the file)
    if tr is None:
        if onsets is not None:
            raise ConfigError("tr= and onsets= go together: tr=SECONDS (the targets' rows are "
                              "TRs) and onsets=O.npy (each sample's onset in seconds)")
        if runs is not None:
            raise ConfigError(f"runs={str(runs)!r} names the run of each TR: give tr=SECONDS "
                              "too (the targets' rows are then TRs)")
        return None, None
    if not float(tr) > 0:
        raise ConfigError(f"tr={tr} must be the seconds per TR, more than 0")
    if onsets is None:
        return float(tr), None
    with open_targets(onsets, option="onsets") as opened:
        if opened.num_columns != 1:
            raise ConfigError(f"onsets={str(onsets)!r} has shape {tuple(opened.array.shape)}; "
                              "give one onset in seconds per sample (or per stored row)")
        values = np.asarray(opened.array, dtype=np.float64).reshape(-1)
    return float(tr), values


def _folds(timeline: Timeline | None, delays: list[int] | None, rows: int, folds: int,
           seed: int) -> tuple[np.ndarray, str]:
    # each row's outer fold, and how they were dealt: a time series in blocks (neighbouring
    # TRs are alike: a random deal would test on the neighbours of training rows), whole runs
    # where there are enough of them (leave-runs-out, the usual practice for fMRI)
    if timeline is not None:
        fold_of, how = timeline.runs.fold_of(folds)
    elif delays is not None:
        fold_of, how = deal_folds(rows, folds, seed, contiguous=True), (
            f"{folds} folds of contiguous rows")
    else:
        return deal_folds(rows, folds, seed), "random"
    log.info("the rows are a time series: %s", how)
    return fold_of, how


def _described(timeline: Timeline | None, delays: list[int] | None, folds_by: str) -> dict:
    # the time series' options, as the results record them (scores.h5's attrs)
    if timeline is None and delays is None:
        return {}
    found = {} if timeline is None else timeline.describe()
    if delays is not None:
        found["delays"] = list(delays)
    found["folds_by"] = folds_by
    return found


def _opened_repeats(repeats, stack: ExitStack) -> Repeats | None:
    if repeats is None:
        return None
    opened = open_repeats(str(repeats))
    stack.callback(opened.close)
    return opened


def _opened_targets(targets, repeated: Repeats | None, budget: int) -> Targets:
    if targets is None:
        if repeated is None:
            raise ConfigError("targets= is required: T.npy (one row per dataset sample) or "
                              "T.h5:NAME, or repeats=R.npy to predict their mean")
        return Targets(f"the mean of repeats={repeated.spec!r}", repeated.mean(budget),
                       option="repeats")
    opened = open_targets(targets)
    if repeated is not None:
        try:
            repeated.check_against(opened)
        except BaseException:
            opened.close()
            raise
    return opened


def _nanmean(values: np.ndarray) -> float:
    defined = values[np.isfinite(values)]
    return float(defined.mean()) if len(defined) else float("nan")


def _design(f: FeatureFile, key: str, target: Targets, max_features: int, seed: int,
            device: torch.device, budget: int, delays: list[int] | None,
            timeline: Timeline | None) -> tuple[Design, SparseProjection | None]:
    # the rows the ridge reads for this key (probe.analyses.encode.design), and the
    # projection they went through, if any
    width = row_width(f[key])
    projection = (SparseProjection(width, max_features, seed, device)
                  if width > max_features else None)
    first_row = None
    if timeline is not None:
        stored = int(f.offsets[-1]) if f.per_token(key) else f.num_rows
        source = FileRows(f, key, np.arange(stored), device, projection)
        design: Design = timeline.design(f, key, source, budget)
        first_row = timeline.runs.first_row
    else:
        order = (check_time_series(f, key) if delays is not None
                 else np.arange(f.num_rows))
        design = FileRows(f, key, order, device, projection)
    if delays is not None:
        design = Delayed(design, delays, first_row)
    return design, projection


def _solve(key: str, design: Design, target: Targets, fold_of: np.ndarray,
           alphas: list[float], budget: int, solver: str) -> dict:
    n, features, columns = design.num_rows, design.features, target.num_columns
    k = int(fold_of.max()) + 1
    if solver == "auto":
        use = _auto(key, n, features, columns, k, budget)
    else:
        use = solver
        log.info("%s: solver=%s (as asked: solver=%s)", key, use, solver)
    chosen = _SOLVERS[use]
    held = chosen.holds(n, features, columns, k)
    if held > budget:
        raise ConfigError(chosen.too_large.format(key=key, n=n, mib=held / (1 << 20)))
    # blocks of rows as read, and the targets' rows
    rows = max(1, (budget // 2) // (design.row_bytes + 16 * columns))
    r, alpha = chosen.solve(key, design, target, fold_of, alphas, budget - held, rows)
    return {"key": key, "score": float(r.mean(0).mean()), "r": r.mean(0), "fold_r": r,
            "alpha": alpha, "solver": use, "features": features}


def _in_memory(key: str, design: Design, target: Targets, fold_of: np.ndarray,
               alphas: list[float], budget: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = torch.cat([design.read(a, b) for a, b in blocks_of(design.num_rows, rows)])
    return solve_in_memory(x, target.rows(design.index), fold_of, alphas)


def _kernel(key: str, design: Design, target: Targets, fold_of: np.ndarray,
            alphas: list[float], budget: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    gram = _gram(design, budget)  # in what the kernel form's own matrices leave
    y = torch.from_numpy(target.rows(design.index)).to(device=gram.device, dtype=torch.float64)
    return solve_kernel(gram, y, fold_of, alphas)


def _auto(key: str, rows: int, features: int, columns: int, folds: int, budget: int) -> str:
    # both exact solvers diagonalise one matrix per training set (folds (folds + 1) / 2 of
    # them): features x features for the streamed sums, training rows x training rows for
    # the kernel form; the smaller one wins, where the Gram matrix fits
    train = rows - rows // folds
    if features <= train:
        why = f"{features} features <= {train} training rows"
        use = "streamed"
    elif kernel_bytes(rows, columns, folds) <= budget:
        why = f"{features} features > {train} training rows, and the Gram matrix fits"
        use = "kernel"
    else:
        why = (f"{features} features > {train} training rows, but a {rows} x {rows} Gram "
               "matrix does not fit in memory_mb")
        use = "streamed"
    log.info("%s: solver=%s (%s)", key, use, why)
    return use


def _gram(design: Design, budget: int) -> torch.Tensor:
    # X Xᵀ of the design's rows, panel by panel: a panel's rows against every later block
    n = design.num_rows
    rows = max(1, min(n, int(max(budget, 1 << 20) // (2 * design.row_bytes))))
    spans = list(blocks_of(n, rows))
    gram = None
    for i, (p0, p1) in enumerate(spans):
        panel = design.read(p0, p1)
        if gram is None:
            gram = panel.new_empty(n, n)
        for b0, b1 in spans[i:]:
            block = panel if b0 == p0 else design.read(b0, b1)
            product = panel @ block.T
            gram[p0:p1, b0:b1] = product
            gram[b0:b1, p0:p1] = product.T
    return gram


def _streamed(key: str, design: Design, target: Targets, fold_of: np.ndarray,
              alphas: list[float], budget: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    # the targets' columns in as few batches as the folds' sums allow (one, mostly)
    k = int(fold_of.max()) + 1
    features = design.features
    if stats_bytes(k, features, 1) > budget // 2:
        need = memory_mb_for(stats_bytes(k, features, 1) * 2)
        raise ConfigError(f"the streamed ridge of {key} ({features} features, {k} folds) needs "
                          f"memory_mb={need:.2g} or more; raise memory_mb or lower "
                          "max_features")
    columns = target.num_columns
    per_batch = columns
    while per_batch > 1 and stats_bytes(k, features, per_batch) > budget // 2:
        per_batch = (per_batch + 1) // 2
    r, chosen = np.zeros((k, columns)), np.zeros((k, columns))
    index = design.index
    for c0, c1 in blocks_of(columns, per_batch):
        sums = FoldAccumulator(k)
        for start, stop in blocks_of(design.num_rows, rows):
            x = design.read(start, stop)
            y = torch.from_numpy(target.rows(index[start:stop])[:, c0:c1]).to(x.device)
            sums.add(x, y, fold_of[start:stop])
        r[:, c0:c1], chosen[:, c0:c1] = solve_streamed(sums.folds, alphas)
    return r, chosen


@dataclass(frozen=True)
class _Solver:
    """How a solver finds a key's scores: ``solve(key, design, target, fold_of, alphas,
    budget, rows) -> (r, alpha)``; ``holds(rows, features, columns, folds)``, the bytes it
    holds at once beyond its blocks of rows (0: within the budget, by its own blocking), and
    ``too_large``, the line that refuses a key whose memory that exceeds; what it needs
    installed."""

    solve: Callable
    holds: Callable[[int, int, int, int], int]
    too_large: str = ""
    needs: tuple[str, ...] = ()


# each solver by its name in solver= (auto picks one of them per key); a new one is a
# function and one entry here
_SOLVERS = {
    "streamed": _Solver(_streamed, lambda rows, features, columns, folds: 0),
    "kernel": _Solver(_kernel, lambda rows, features, columns, folds: kernel_bytes(
        rows, columns, folds), "solver=kernel holds a {n} x {n} Gram matrix, about {mib:.0f} "
        "MiB with its fits, more than memory_mb allows; use solver=auto or streamed, or raise "
        "memory_mb"),
    "himalaya": _Solver(_in_memory, himalaya_bytes, "solver=himalaya holds {key}'s rows in "
                        "memory, about {mib:.0f} MiB, more than memory_mb allows; use "
                        "solver=auto or raise memory_mb", needs=("himalaya",)),
}
SOLVERS = ("auto", *_SOLVERS)


def default_out_dir(path: str | Path) -> Path:
    """``<file's folder>/<file stem>_encode``: where ``python -m probe.encode`` writes."""
    return beside(path, "encode")


def write_results(results: list[dict], out_dir: str | Path, *, file: str | Path,
                  targets: str | Path, folds: int, alphas: list[float] | None = None,
                  seed: int = _Defaults.seed) -> list[Path]:
    """Write ``encoding.csv`` (``key,score``, and ``score_normalised`` with repeats) and
    ``scores.h5`` (``r/<key>``: each target column's r, ``fold_r/<key>`` and
    ``alpha/<key>``: per outer fold; with repeats ``r_normalised/<key>`` and
    ``reliability``, each target's; the results' ``design`` in its root attrs) into
    ``out_dir``.

    Raises:
        OutputError: ``out_dir`` cannot be written.
    """
    ceiling = bool(results) and "reliability" in results[0]
    with writing(out_dir) as out_dir:
        write_csv(out_dir / "encoding.csv", COLUMNS + (("score_normalised",) if ceiling else ()),
                  results)
        with h5py.File(out_dir / "scores.h5", "w") as h5:
            h5.attrs.update({
                "file": str(file), "targets": str(targets), "folds": int(folds), "seed": seed,
                "alphas": np.asarray(ALPHAS if alphas is None else alphas, dtype=np.float64),
                "score": "mean over the target columns of the held-out Pearson r, each "
                         "column's r averaged over the outer folds"})
            # the time series' options (delays, tr, onsets, hrf, runs, folds_by), as given
            h5.attrs.update(results[0].get("design", {}) if results else {})
            if ceiling:
                h5["reliability"] = results[0]["reliability"]
                h5["reliability"].attrs["what"] = (
                    "each target's split-half reliability over the repeats (even against odd), "
                    "Spearman-Brown corrected; r_normalised = r / sqrt(reliability)")
            for r in results:
                h5[f"r/{r['key']}"] = r["r"]
                h5[f"fold_r/{r['key']}"] = r["fold_r"]
                h5[f"alpha/{r['key']}"] = r["alpha"]
                if ceiling:
                    h5[f"r_normalised/{r['key']}"] = r["r_normalised"]
                if "band_weights" in r:
                    h5[f"band_weights/{r['key']}"] = r["band_weights"]
                h5[f"r/{r['key']}"].attrs.update(
                    {name: value for name, value in r.items() if name not in _NOT_ATTRS})
    return [out_dir / "encoding.csv", out_dir / "scores.h5"]


# the per-target results, written as datasets rather than attrs, and the design, the root's
_NOT_ATTRS = ("key", "r", "fold_r", "alpha", "reliability", "r_normalised", "band_weights",
              "design")


def format_table(results: list[dict]) -> str:
    """The scores as an aligned text table, one line per key."""
    ceiling = bool(results) and "score_normalised" in results[0]
    head = ("key", "score", *(("normalised",) if ceiling else ()), "features", "solver")
    return aligned([head] + [
        (r["key"], f"{r['score']:.3f}",
         *((f"{r['score_normalised']:.3f}",) if ceiling else ()),
         str(r["features"]) + (f" (of {r['input_features']})" if "input_features" in r
                               else ""), r["solver"])
        for r in results])
