"""probe.encode against its peers on the issue's problem: 5000 rows x 3 keys x 200 targets.

    python benchmarks/bench_encode.py                          # the issue's size, 3 repeats
    python benchmarks/bench_encode.py --repeat 1               # one: 54 min on 2 shared cores
    python benchmarks/bench_encode.py --rows 600 --targets 20 --repeat 1    # a quick look
    python benchmarks/bench_encode.py --methods probe himalaya-kernel --memory-mb 256

The file: a probe file written with probe's own Store, three keys of float32 rows of different
widths (early 512, middle 2048, late 4096; each a noisy nonlinear map of a shared latent, as the
layers of one network are), and targets (rows x targets, float64) a noisy linear map of the
middle key, so that the middle key is the clear winner. None is wider than probe's default
max_features (4096), so nothing is projected and every method sees the same features.

The scheme is probe's (probe.analyses.encode.ridge): the outer folds are probe's
``deal_folds(rows, folds, seed)``, written to a file that every method reads; for each outer
fold each target's alpha is chosen by an inner search over the other folds in turn, from
probe's ALPHAS, by the mean validation squared error (ties to the larger alpha); the result is
each column's held-out Pearson r averaged over the outer folds, and a key's score their mean.
The peers get the same outer folds, the same inner splits (``cv=`` a list of (train, test)
index arrays, as probe's solver=himalaya passes them) and the same alpha grid:

    probe             probe.analyses.encode.encode, its default (solver=auto)
    probe-streamed    the same, solver=streamed (the sums over blocks of rows only)
    himalaya-ridge    himalaya.ridge.RidgeCV(alphas, fit_intercept=True, cv=inner splits)
    himalaya-kernel   himalaya.kernel_ridge.KernelRidgeCV(alphas, kernel="linear",
                      fit_intercept=True, cv=inner splits)
    sklearn-ridge     scikit-learn's Ridge(solver="svd") on the same inner splits: one fit
                      per split for the whole grid (alpha= one penalty per target column, the
                      targets tiled once per alpha), alpha per target, a refit per outer fold
    sklearn-gcv       scikit-learn's RidgeCV(alphas, alpha_per_target=True) with cv=None: its
                      efficient leave-one-out (GCV) search, *another* inner search, so its r
                      differ from probe's; shown for its time, not counted as a peer
    sklearn-ridgecv   scikit-learn's RidgeCV(alphas, cv=inner splits,
                      scoring="neg_mean_squared_error") one target column at a time, on the
                      first --sklearn-columns columns only, its seconds scaled to all targets;
                      opt-in (by --methods), at the issue's size it would take hours

scikit-learn's RidgeCV cannot itself take both: ``RidgeCV(alpha_per_target=True, cv=...)``
raises "cv!=None and alpha_per_target=True are incompatible", hence sklearn-ridge (the same
scheme by sklearn's Ridge) and sklearn-ridgecv (RidgeCV a column at a time).
himalaya runs on its torch backend (float64, on the CPU) by default, ``--backend numpy`` for
its numpy one: on this 2-core machine, for one outer fold at the issue's size (4000 training
rows, 200 targets), KernelRidgeCV on 4096 features took 60 s with torch against 124 s with
numpy, and RidgeCV on 2048 features 152 s against 141 s (a tie, the machine being shared).

Each run of a method is a fresh process (``--worker``), so that its peak resident memory
(VmHWM) above its imports is its own; the seconds are those of the computation after the
imports, reading the file included. The methods alternate within each repeat (the order
reversed every other repeat); the table quotes medians, and each ratio is the median over the
repeats of (method seconds / probe seconds in the same repeat). The machine may be shared and
noisy: ``uptime`` is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's probe, as the measured processes use

KEYS = ("early/output", "middle/output", "late/output")
WIDTHS = dict(zip(KEYS, (512, 2048, 4096), strict=True))  # --widths changes them
WINNER = "middle/output"
LATENT = 64

METHODS = {
    "probe": "probe, solver=auto (default)",
    "probe-streamed": "probe, solver=streamed",
    "himalaya-ridge": "himalaya RidgeCV",
    "himalaya-kernel": "himalaya KernelRidgeCV",
    "sklearn-ridge": "sklearn Ridge(svd), same splits",
    "sklearn-gcv": "sklearn RidgeCV GCV (LOO)*",
    "sklearn-ridgecv": "sklearn RidgeCV per column**",
}
DEFAULT_METHODS = ["probe", "probe-streamed", "himalaya-ridge", "himalaya-kernel",
                   "sklearn-ridge", "sklearn-gcv"]
SAME_SCHEME_PEERS = ("himalaya-ridge", "himalaya-kernel", "sklearn-ridge", "sklearn-ridgecv")


# ----------------------------------------------------------------------------- the problem

def make_problem(folder: Path, rows: int, targets: int, folds: int, seed: int
                 ) -> tuple[Path, Path, Path]:
    """The probe file, the targets (.npy) and probe's outer folds (.npy) in ``folder``."""
    import torch

    from probe.analyses.encode.ridge import deal_folds
    from probe.file.format import DatasetSpec
    from probe.file.store import Store

    rng = np.random.default_rng(1)
    latent = rng.normal(size=(rows, LATENT))
    mixes = {key: np.random.default_rng([2, i]).normal(size=(LATENT, width)) / np.sqrt(LATENT)
             for i, (key, width) in enumerate(WIDTHS.items())}
    weights = rng.normal(size=(WIDTHS[WINNER], targets)) / np.sqrt(WIDTHS[WINNER])
    y = np.empty((rows, targets))
    path = folder / "features.h5"
    specs = {key: DatasetSpec((width,), "float32") for key, width in WIDTHS.items()}
    layers = [key.partition("/")[0] for key in WIDTHS]
    with Store(path, config_yaml="{}", num_rows=rows, datasets=specs, has_target=False,
               attrs={"layers": layers}) as store:
        for start in range(0, rows, 1024):
            stop = min(rows, start + 1024)
            values = {}
            for key, width in WIDTHS.items():
                x = np.tanh(latent[start:stop] @ mixes[key]) + 0.7 * rng.normal(
                    size=(stop - start, width))
                values[key] = x.astype(np.float32)
            y[start:stop] = (values[WINNER].astype(np.float64) @ weights
                             + 0.8 * rng.normal(size=(stop - start, targets)))
            store.append(torch.arange(start, stop), None, values)
        store.finish()
    np.save(folder / "targets.npy", y)
    np.save(folder / "folds.npy", deal_folds(rows, folds, seed))
    return path, folder / "targets.npy", folder / "folds.npy"


# ----------------------------------------------------------------------------- the workers

def _peak() -> int:
    text = Path("/proc/self/status").read_text()
    return int(text.split("VmHWM:")[1].split()[0]) * 1024


def _pearson(prediction: np.ndarray, target: np.ndarray) -> np.ndarray:
    # the Pearson r of each column (probe.analyses.encode.ridge.pearson_columns, without
    # importing probe, and torch with it, into the peers' processes)
    u = prediction - prediction.mean(0)
    c = target - target.mean(0)
    variance = (u * u).sum(0) * (c * c).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (u * c).sum(0) / np.sqrt(variance)
    return np.where(variance > 0, r, 0.0)


def _probe_worker(args, keys: list[str]) -> dict:
    from probe.analyses.encode import encode

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("probe")
    logger.setLevel(logging.INFO)
    logger.addHandler(Keep())
    solver = "auto" if args.worker == "probe" else "streamed"
    imports = _peak()
    began_wall = time.time()
    began = time.perf_counter()
    results = encode(args.file, args.targets_file, keys, folds=args.folds, seed=args.seed,
                     memory_mb=args.memory_mb, solver=solver)
    seconds = time.perf_counter() - began
    peak = _peak()
    assert not any("projection" in r for r in results), "a key was projected"
    # each key's seconds: from the start, or the previous key's score line, to its own
    done, key_seconds, previous = {}, {}, began_wall
    for record in records:
        if ": score " in record.getMessage():
            done[record.getMessage().split(": score ")[0]] = record.created
    for key in keys:
        key_seconds[key], previous = done.get(key, previous) - previous, done.get(key, previous)
    return {"seconds": seconds, "peak": peak, "imports": imports,
            "r": {r["key"]: r["r"].tolist() for r in results},
            "solver": {r["key"]: r["solver"] for r in results},
            "key_seconds": key_seconds,
            "log": [f"{record.name}: {record.getMessage()}" for record in records]}


def _peer_worker(args, keys: list[str]) -> dict:
    import h5py

    method, alphas = args.worker, np.asarray(args.alphas, dtype=np.float64)
    if method.startswith("himalaya"):
        from himalaya.backend import set_backend
        from himalaya.kernel_ridge import KernelRidgeCV
        from himalaya.ridge import RidgeCV as HimalayaRidgeCV

        backend = set_backend(args.backend)
    else:
        from sklearn.linear_model import Ridge, RidgeCV

    def himalaya_ridge(x, y, inner, test):
        model = HimalayaRidgeCV(alphas=alphas, fit_intercept=True, cv=inner,
                                solver_params={"warn": False})
        return backend.to_numpy(model.fit(x, y).predict(test))

    def himalaya_kernel(x, y, inner, test):
        model = KernelRidgeCV(alphas=alphas, kernel="linear", fit_intercept=True, cv=inner,
                              warn=False)
        return backend.to_numpy(model.fit(x, y).predict(test))

    def sklearn_ridge(x, y, inner, test):
        a, v = len(alphas), y.shape[1]
        scores = np.zeros((a, v))
        for train, held in inner:  # column j * v + c: alpha j, target c
            model = Ridge(alpha=np.repeat(alphas, v), solver="svd").fit(x[train],
                                                                        np.tile(y[train], a))
            error = np.tile(y[held], a) - model.predict(x[held])
            scores -= (error * error).mean(0).reshape(a, v)
        scores = scores / len(inner) + 1e-10 * np.log(alphas)[:, None]  # ties: larger alpha
        model = Ridge(alpha=alphas[scores.argmax(0)], solver="svd").fit(x, y)
        return model.predict(test)

    def sklearn_gcv(x, y, inner, test):
        return RidgeCV(alphas=alphas, alpha_per_target=True).fit(x, y).predict(test)

    def sklearn_ridgecv(x, y, inner, test):
        return np.stack([RidgeCV(alphas=alphas, cv=inner, scoring="neg_mean_squared_error")
                         .fit(x, y[:, c]).predict(test) for c in range(y.shape[1])], axis=1)

    fit_predict = {"himalaya-ridge": himalaya_ridge, "himalaya-kernel": himalaya_kernel,
                   "sklearn-ridge": sklearn_ridge, "sklearn-gcv": sklearn_gcv,
                   "sklearn-ridgecv": sklearn_ridgecv}[method]
    imports = _peak()
    began = time.perf_counter()
    fold_of = np.load(args.folds_file)
    k = int(fold_of.max()) + 1
    members = [np.flatnonzero(fold_of == g) for g in range(k)]
    r, key_seconds = {}, {}
    with h5py.File(args.file, "r") as f:
        index = f["index"][:]
        y = np.load(args.targets_file)[index].astype(np.float64)
        if method == "sklearn-ridgecv":
            y = y[:, :args.sklearn_columns]
        for key in keys:
            key_began = time.perf_counter()
            x = f[key][:].astype(np.float64)
            fold_r = np.zeros((k, y.shape[1]))
            for outer in range(k):
                # as probe's solver=himalaya: training rows fold by fold, each inner split
                # validating on one of the other folds
                others = [g for g in range(k) if g != outer]
                train = np.concatenate([members[g] for g in others])
                starts = np.cumsum([0] + [len(members[g]) for g in others])
                positions = np.arange(len(train))
                inner = [(np.setdiff1d(positions, positions[a:b]), positions[a:b])
                         for a, b in zip(starts[:-1], starts[1:], strict=True)]
                prediction = fit_predict(x[train], y[train], inner, x[members[outer]])
                fold_r[outer] = _pearson(np.asarray(prediction).reshape(len(members[outer]), -1),
                                         y[members[outer]])
            r[key] = fold_r.mean(0).tolist()
            key_seconds[key] = time.perf_counter() - key_began
            del x
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "peak": _peak(), "imports": imports, "r": r,
            "key_seconds": key_seconds, "log": []}


def worker(args) -> None:
    keys = list(KEYS)
    found = (_probe_worker if args.worker.startswith("probe") else _peer_worker)(args, keys)
    print(json.dumps(found))


# ----------------------------------------------------------------------------- the parent

def run_method(method: str, args, file: Path, targets: Path, folds_file: Path,
               alphas: list[float]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", method,
               "--file", str(file), "--targets-file", str(targets), "--folds-file", str(folds_file),
               "--folds", str(args.folds), "--seed", str(args.seed),
               "--memory-mb", str(args.memory_mb), "--backend", args.backend,
               "--sklearn-columns", str(args.sklearn_columns),
               "--widths", *map(str, WIDTHS.values()),
               "--alphas", *map(repr, alphas)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"})
    if result.returncode:
        raise SystemExit(f"{method} failed:\n{result.stderr}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    found["stderr"] = result.stderr
    return found


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def best_key(r: dict) -> str:
    return max(r, key=lambda key: float(np.mean(r[key])))


def report(args, runs: dict[str, list[dict]], alphas: list[float]) -> None:
    methods = list(runs)
    mib = 2**20
    reference = runs.get("probe")
    columns = args.targets
    widths = ", ".join(f"{key} {width}" for key, width in WIDTHS.items())
    print(f"\n{args.rows} rows x {len(WIDTHS)} keys ({widths} features) x {columns} targets;"
          f" {args.folds} outer folds (seed {args.seed}), "
          f"{len(alphas)} alphas {alphas[0]:g} .. {alphas[-1]:g}; probe memory_mb="
          f"{args.memory_mb:g}; himalaya backend={args.backend}; {args.repeat} repeat(s)")
    header = (f"{'method':32}{'median s':>10}{'ratio':>8}{'peak MiB':>10}{'max |dr|':>10}"
              f"  best key")
    print(header)
    print("-" * len(header))
    for method in methods:
        seconds = [run["seconds"] for run in runs[method]]
        scale = columns / args.sklearn_columns if method == "sklearn-ridgecv" else 1.0
        median = statistics.median(seconds) * scale
        if reference:
            ratio = statistics.median(scale * run["seconds"] / ref["seconds"]
                                      for run, ref in zip(runs[method], reference, strict=True))
            ratio_text = f"{ratio:.2f}"
        else:
            ratio_text = "-"
        above = max(run["peak"] - run["imports"] for run in runs[method]) / mib
        first = runs[method][0]["r"]
        if reference:
            gap = max(float(np.max(np.abs(np.asarray(first[key])
                                          - np.asarray(reference[0]["r"][key][:len(first[key])]))))
                      for key in first)
            gap_text = f"{gap:.1e}"
        else:
            gap_text = "-"
        print(f"{METHODS[method]:32}{median:>10.2f}{ratio_text:>8}{above:>10.0f}{gap_text:>10}"
              f"  {best_key(first)}")
    print("ratio: median over the repeats of (method s / probe s in the same repeat); peak: the "
          "largest VmHWM above the imports over the repeats; max |dr|: the largest difference "
          "from probe's r over every key and target column")
    if "sklearn-gcv" in runs:
        print("*  sklearn-gcv searches alpha by leave-one-out over the outer training rows (not "
              "the inner splits): its r differ by design; not counted as a peer")
    if "sklearn-ridgecv" in runs:
        print(f"** sklearn-ridgecv ran on the first {args.sklearn_columns} target columns; its "
              f"seconds and ratio are scaled to all {columns}, its best key and |dr| are of those "
              "columns")

    print("\nseconds per key (medians; probe's from its log lines' times):")
    print(f"{'method':32}" + "".join(f"{key:>16}" for key in WIDTHS))
    for method in methods:
        scale = columns / args.sklearn_columns if method == "sklearn-ridgecv" else 1.0
        print(f"{METHODS[method]:32}" + "".join(
            f"{statistics.median(run['key_seconds'][key] for run in runs[method]) * scale:>16.2f}"
            for key in WIDTHS))

    for method in ("probe", "probe-streamed"):
        if method in runs:
            print(f"\n{method}'s log (first run):")
            for line in runs[method][0]["log"]:
                print(f"  {line}")
            peaks = [(run["peak"] - run["imports"]) / mib for run in runs[method]]
            print(f"  peak above imports {max(peaks):.0f} MiB, memory_mb={args.memory_mb:g}: "
                  f"{'within' if max(peaks) <= args.memory_mb else 'OVER'} the budget")

    if reference:
        print()
        winners = {method: best_key(runs[method][0]["r"]) for method in methods}
        same = [m for m in methods if m in SAME_SCHEME_PEERS]
        agree = all(winners[m] == winners["probe"] for m in same)
        print(f"best key: probe {winners['probe']}; same-scheme peers "
              f"{'all agree' if agree else 'DISAGREE: ' + str(winners)}")
        if same:
            ratios = {m: statistics.median(
                (columns / args.sklearn_columns if m == "sklearn-ridgecv" else 1.0)
                * run["seconds"] / ref["seconds"]
                for run, ref in zip(runs[m], reference, strict=True)) for m in same}
            fastest = min(ratios, key=ratios.get)
            verdict = 1 / ratios[fastest]
            print(f"probe's default / the fastest same-scheme peer ({METHODS[fastest]}): "
                  f"{verdict:.2f}x -> {'meets' if verdict <= 1.0 else 'MISSES'} <= 1.0x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--targets", type=int, default=200, help="target columns")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-mb", type=float, default=None,
                        help="probe's budget (default: probe.encode's, EncodeConfig.memory_mb)")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=DEFAULT_METHODS)
    parser.add_argument("--backend", choices=["numpy", "torch"], default="torch",
                        help="himalaya's backend")
    parser.add_argument("--sklearn-columns", type=int, default=2,
                        help="the target columns sklearn-ridgecv runs (its time is scaled)")
    parser.add_argument("--widths", nargs=3, type=int, default=list(WIDTHS.values()),
                        help="the three keys' features (smaller for a quick look)")
    parser.add_argument("--folds", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--worker", choices=list(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--targets-file", help=argparse.SUPPRESS)
    parser.add_argument("--folds-file", help=argparse.SUPPRESS)
    parser.add_argument("--alphas", nargs="+", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    WIDTHS.update(zip(KEYS, args.widths, strict=True))
    if args.worker:
        worker(args)
        return

    from probe.analyses.encode.config import ALPHAS, EncodeConfig

    args.memory_mb = EncodeConfig.memory_mb if args.memory_mb is None else args.memory_mb
    args.folds = EncodeConfig.folds if args.folds is None else args.folds
    args.seed = EncodeConfig.seed if args.seed is None else args.seed
    args.sklearn_columns = min(args.sklearn_columns, args.targets)
    alphas = sorted(ALPHAS)
    methods = [m for m in METHODS if m in args.methods]  # probe first, the ratios' reference
    print(f"start: {uptime()}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        file, targets, folds_file = make_problem(Path(folder), args.rows, args.targets,
                                                 args.folds, args.seed)
        size = file.stat().st_size / 2**20
        print(f"file {size:.0f} MiB of float32 rows, targets {args.rows} x {args.targets}",
              flush=True)
        for repeat in range(args.repeat):
            order = methods if repeat % 2 == 0 else methods[::-1]
            for method in order:
                found = run_method(method, args, file, targets, folds_file, alphas)
                runs[method].append(found)
                print(f"  repeat {repeat + 1}: {method:16} {found['seconds']:8.2f} s", flush=True)
    report(args, runs, alphas)
    print(f"\nend: {uptime()}")


if __name__ == "__main__":
    main()
