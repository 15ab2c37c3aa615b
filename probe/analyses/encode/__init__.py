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
(probe.analyses.encode.projection), recorded in scores.h5.
"""

from __future__ import annotations

import logging
from pathlib import Path

import h5py
import numpy as np
import torch

from probe.analyses.encode.config import ALPHAS
from probe.analyses.encode.config import EncodeConfig as _Defaults
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
from probe.analyses.stats import AlignedRows, analysis_device, blocks_of, budget_bytes, select_keys
from probe.analyses.tables import aligned, beside, write_csv, writing
from probe.errors import ConfigError
from probe.file.read import FeatureFile, open_checked

__all__ = ["encode", "write_results", "format_table", "default_out_dir", "COLUMNS", "SOLVERS"]

log = logging.getLogger(__name__)

COLUMNS = ("key", "score")
SOLVERS = ("auto", "himalaya", "streamed", "kernel")


def encode(path: str | Path, targets: str | Path, keys: list[str] | None = _Defaults.keys, *,
           folds: int = _Defaults.folds, alphas: list[float] | None = None,
           max_features: int = _Defaults.max_features, seed: int = _Defaults.seed,
           device: str = _Defaults.device, memory_mb: float = _Defaults.memory_mb,
           solver: str = _Defaults.solver) -> list[dict]:
    """Fit and test a cross-validated ridge encoding model per stored key.

    The defaults are those of ``python -m probe.encode`` (probe.analyses.encode.config).

    Args:
        path: a finished probe file with one row per sample.
        targets: ``T.npy`` (N, V) or ``T.h5:name``; row i belongs to dataset sample i.
        keys: "<layer>/<kind>"s or "<layer>"s; None for every stored dataset.
        folds: outer folds (at least 3; the inner search uses the others).
        alphas: the penalties to choose from per target; None for
            probe.analyses.encode.config.ALPHAS.
        max_features: wider rows are projected to this many features first.
        seed: deals the folds and draws the projection.
        device: where the ridge is solved (``cpu``, ``cuda``, ``auto``).
        memory_mb: MiB for the rows and sums held at once.
        solver: ``auto`` (himalaya where the rows fit in memory_mb, else streamed),
            ``himalaya`` or ``streamed``.

    Returns:
        One dict per key, in the model's order: ``key``, ``score``, ``r`` (V,) each column's
        r, ``fold_r`` and ``alpha`` (folds, V), and how it was solved (``solver``,
        ``features``, and the projection's ``input_features``, ``projection``, ... where one
        was made).

    Raises:
        ProbeError: the file or targets are missing or unfinished, a key is not in the file
            or holds rows per token, the targets have another number of rows than the dataset
            has samples; or a bad option (named, with what to use instead).
    """
    alphas = _checked_alphas(ALPHAS if alphas is None else alphas)
    if solver not in SOLVERS:
        raise ConfigError(f"solver={solver!r}: use auto, streamed, kernel or himalaya")
    if int(max_features) < 1:
        raise ConfigError(f"max_features={max_features} must be at least 1")
    if solver == "himalaya" and not have_himalaya():
        raise ConfigError("solver=himalaya needs himalaya: pip install 'probe[analysis]', or "
                          "use solver=streamed")
    budget = budget_bytes(memory_mb)
    torch_device = analysis_device(device)
    with open_checked(path) as f, open_targets(targets) as target:
        selected = select_keys(f, keys)
        token_rows = [key for key in selected if f.per_token(key)]
        if token_rows:
            raise ConfigError(
                f"{', '.join(token_rows)} hold one row per token (tokens=all), and the targets "
                "one row per sample; run probe with tokens=last or tokens=mean")
        target.check_rows_of(f)
        check_folds(folds, f.num_rows)
        fold_of = deal_folds(f.num_rows, int(folds), int(seed))
        results = []
        for key in selected:
            results.append(_encode_key(f, key, target, fold_of, alphas, int(max_features),
                                       int(seed), torch_device, budget, solver))
            log.info("%s: score %.3f (%s, %d features%s)", key, results[-1]["score"],
                     results[-1]["solver"], results[-1]["features"],
                     f", projected from {results[-1]['input_features']}"
                     if "projection" in results[-1] else "")
    return results


def _checked_alphas(alphas) -> list[float]:
    values = [float(a) for a in alphas]
    if not values or min(values) <= 0:
        raise ConfigError(f"alphas={values} must be one or more positive penalties, e.g. "
                          "'alphas=[1,10,100]'")
    return sorted(set(values))


def _encode_key(f: FeatureFile, key: str, target: Targets, fold_of: np.ndarray,
                alphas: list[float], max_features: int, seed: int, device: torch.device,
                budget: int, solver: str) -> dict:
    reader = AlignedRows({key: (f, key)}, {key: np.arange(f.num_rows)}, device)
    width = reader.width(key)
    projection = (SparseProjection(width, max_features, seed, device)
                  if width > max_features else None)
    features = projection.components if projection else width
    n, columns = f.num_rows, target.num_columns
    k = int(fold_of.max()) + 1
    use = solver if solver != "auto" else _auto(key, n, features, columns, k, budget)
    if use == "himalaya" and himalaya_bytes(n, features, columns, k) > budget:
        need = himalaya_bytes(n, features, columns, k) / (1 << 20)
        raise ConfigError(f"solver=himalaya holds {key}'s rows in memory, about {need:.0f} MiB, "
                          f"more than memory_mb allows; use solver=auto or raise memory_mb")
    if use == "kernel" and kernel_bytes(n, columns, k) > budget:
        need = kernel_bytes(n, columns, k) / (1 << 20)
        raise ConfigError(f"solver=kernel holds a {n} x {n} Gram matrix, about {need:.0f} MiB "
                          "with its fits, more than memory_mb allows; use solver=auto or "
                          "streamed, or raise memory_mb")
    index = f.index
    # blocks of raw rows, their float64 copy and projection, and the targets' rows
    row_bytes = 16 * width + 8 * features + 16 * columns
    rows = max(1, (budget // 2) // row_bytes)
    if use == "himalaya":
        x = torch.cat([_projected(reader, key, a, b, projection)
                       for a, b in blocks_of(n, rows)])
        r, chosen = solve_in_memory(x, target.rows(index), fold_of, alphas)
        del x
    elif use == "kernel":
        gram = _gram(reader, key, projection, budget - kernel_bytes(n, columns, k), features)
        y = torch.from_numpy(target.rows(index)).to(device=gram.device, dtype=torch.float64)
        r, chosen = solve_kernel(gram, y, fold_of, alphas)
        del gram
    else:
        r, chosen = _streamed(reader, key, target, index, fold_of, alphas, projection,
                              features, budget, rows)
    found = {"key": key, "score": float(r.mean(0).mean()), "r": r.mean(0), "fold_r": r,
             "alpha": chosen, "solver": use, "features": features}
    if projection is not None:
        found.update(projection.describe())
    return found


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


def _gram(reader: AlignedRows, key: str, projection, budget: int, features: int
          ) -> torch.Tensor:
    # X Xᵀ of the (projected) rows, panel by panel: a panel's rows against every later block
    n = reader.num_rows
    rows = max(1, min(n, int(max(budget, 1 << 20) // (2 * (16 * reader.width(key)
                                                           + 8 * features)))))
    spans = list(blocks_of(n, rows))
    gram = torch.empty(n, n, dtype=torch.float64, device=reader.device)
    for i, (p0, p1) in enumerate(spans):
        panel = _projected(reader, key, p0, p1, projection)
        for b0, b1 in spans[i:]:
            block = panel if b0 == p0 else _projected(reader, key, b0, b1, projection)
            product = panel @ block.T
            gram[p0:p1, b0:b1] = product
            gram[b0:b1, p0:p1] = product.T
    return gram


def _projected(reader: AlignedRows, key: str, start: int, stop: int,
               projection: SparseProjection | None) -> torch.Tensor:
    x = reader.read(start, stop, [key])[key]
    return projection(x) if projection is not None else x


def _streamed(reader: AlignedRows, key: str, target: Targets, index: np.ndarray,
              fold_of: np.ndarray, alphas: list[float], projection, features: int,
              budget: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    # the targets' columns in as few batches as the folds' sums allow (one, mostly)
    k = int(fold_of.max()) + 1
    if stats_bytes(k, features, 1) > budget // 2:
        need = stats_bytes(k, features, 1) * 2 / (1 << 20)
        raise ConfigError(f"the streamed ridge of {key} ({features} features, {k} folds) needs "
                          f"about {need:.2g} MiB; raise memory_mb or lower max_features")
    columns = target.num_columns
    per_batch = columns
    while per_batch > 1 and stats_bytes(k, features, per_batch) > budget // 2:
        per_batch = (per_batch + 1) // 2
    r, chosen = np.zeros((k, columns)), np.zeros((k, columns))
    for c0, c1 in blocks_of(columns, per_batch):
        sums = FoldAccumulator(k)
        for start, stop in blocks_of(reader.num_rows, rows):
            x = _projected(reader, key, start, stop, projection)
            y = torch.from_numpy(target.rows(index[start:stop])[:, c0:c1]).to(x.device)
            sums.add(x, y, fold_of[start:stop])
        r[:, c0:c1], chosen[:, c0:c1] = solve_streamed(sums.folds, alphas)
    return r, chosen


def default_out_dir(path: str | Path) -> Path:
    """``<file's folder>/<file stem>_encode``: where ``python -m probe.encode`` writes."""
    return beside(path, "encode")


def write_results(results: list[dict], out_dir: str | Path, *, file: str | Path,
                  targets: str | Path, folds: int, alphas: list[float] | None = None,
                  seed: int = _Defaults.seed) -> list[Path]:
    """Write ``encoding.csv`` (``key,score``) and ``scores.h5`` (``r/<key>``: each target
    column's r, ``fold_r/<key>`` and ``alpha/<key>``: per outer fold) into ``out_dir``.

    Raises:
        OutputError: ``out_dir`` cannot be written.
    """
    with writing(out_dir) as out_dir:
        write_csv(out_dir / "encoding.csv", COLUMNS, results)
        with h5py.File(out_dir / "scores.h5", "w") as h5:
            h5.attrs.update({
                "file": str(file), "targets": str(targets), "folds": int(folds), "seed": seed,
                "alphas": np.asarray(ALPHAS if alphas is None else alphas, dtype=np.float64),
                "score": "mean over the target columns of the held-out Pearson r, each "
                         "column's r averaged over the outer folds"})
            for r in results:
                h5[f"r/{r['key']}"] = r["r"]
                h5[f"fold_r/{r['key']}"] = r["fold_r"]
                h5[f"alpha/{r['key']}"] = r["alpha"]
                h5[f"r/{r['key']}"].attrs.update(
                    {name: value for name, value in r.items()
                     if name not in ("key", "r", "fold_r", "alpha")})
    return [out_dir / "encoding.csv", out_dir / "scores.h5"]


def format_table(results: list[dict]) -> str:
    """The scores as an aligned text table, one line per key."""
    return aligned([("key", "score", "features", "solver")] + [
        (r["key"], f"{r['score']:.3f}", str(r["features"]) + (
            f" (of {r['input_features']})" if "input_features" in r else ""), r["solver"])
        for r in results])
