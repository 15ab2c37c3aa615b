"""CKA and RSA between all pairs of 6 layers of two files: probe.analyses.compare against the
in-memory methods, which load both files first, and the field's peers.

    python benchmarks/bench_compare.py                        # two files of 5000 rows, 9192 wide
    python benchmarks/bench_compare.py --rows 2000 --repeat 1 --methods probe-cka numpy-cka
    python benchmarks/bench_compare.py --memory-mb 256        # probe within a small budget
    python benchmarks/bench_compare.py --device cuda          # probe's sums on a GPU

The methods (``--methods``, all by default):

- ``probe-cka``, ``probe-rsa``: ``probe.analyses.compare.compare`` on the two files;
- ``numpy-cka``: both files loaded whole in float64, centred, then the feature-space form
  ``||Xcᵀ Yc||_F² / (||Xcᵀ Xc||_F ||Ycᵀ Yc||_F)`` for every pair: the reference of CKA;
- ``thingsvision-cka``: thingsvision's ``CKANumPy`` (linear kernel, biased), pair by pair
  (three N x N Gram matrices a pair: minutes at the default size; ``--repeat 1`` for it);
- ``scipy-rsa``: ``pdist(x, 'correlation')`` RDMs and the Spearman correlation of the condensed
  RDMs (each ranked once): the reference of RSA;
- ``rsatoolbox-rsa``: ``calc_rdm(..., method='correlation')`` and
  ``compare(..., method='spearman')``.

RSA uses the ``--rsa-rows`` samples that probe's ``rdm_samples`` draws with seed 0 (the other
methods draw the same ones). Each method runs in a fresh process, so that its peak resident
memory (VmHWM, as benchmarks/peak.py reads it) is its own; "above imports" is that peak less the
peak after the method's imports, and the seconds are those of the computation after them. The
methods take turns (``--repeat`` rounds, each in another order) and the table gives medians: the
machine may be shared and noisy, and the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's probe, as the measured processes use
# six layers of 9192 features in all: pooled convolutions, then two wide ones
WIDTHS = (64, 128, 256, 512, 4096, 4136)

# every method's process: the files, the options as JSON; it prints one JSON line
_HEAD = """
import json, sys, time
def peak():
    text = open('/proc/self/status').read()
    return int(text.split('VmHWM:')[1].split()[0]) * 1024
a, b, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
"""

_TAIL = """
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "peak": peak(), "imports": start,
                  "values": [[float(v) for v in row] for row in values]}))
"""

# the layers of a file, whole, in float64 (the in-memory methods)
_LOAD = """
import h5py
import numpy as np
def load(path, rows=None):
    with h5py.File(path, "r") as f:
        keys = [f"layer{i}/output" for i in range(len(f.attrs["layers"]))]
        layers = [f[k][:].astype(np.float64) for k in keys]
    return layers if rows is None else [x[rows] for x in layers]
def rsa_rows(n):  # the samples that probe's rdm_samples draws (probe.analyses.compare.rsa)
    k = options["rsa_rows"]
    return np.arange(n) if n <= k else np.sort(
        np.random.default_rng(0).choice(n, k, replace=False))
"""

_CODE = {
    "probe-cka": """
import probe.analyses.compare
start = peak()
began = time.perf_counter()
values = probe.analyses.compare.compare(a, b, metric="cka", device=options["device"],
                                        memory_mb=options["memory_mb"]).matrix()
""",
    "numpy-cka": _LOAD + """
start = peak()
began = time.perf_counter()
def centred(path):
    return [x - x.mean(0) for x in load(path)]
xs, ys = centred(a), centred(b)
norm_x = [np.linalg.norm(x.T @ x) for x in xs]
norm_y = [np.linalg.norm(y.T @ y) for y in ys]
values = [[np.linalg.norm(x.T @ y) ** 2 / (nx * ny) for y, ny in zip(ys, norm_y)]
          for x, nx in zip(xs, norm_x)]
""",
    # thingsvision's package __init__ imports its whole extraction stack (torchtyping, timm,
    # ...): its CKA modules are loaded alone, as a package of their own
    "thingsvision-cka": _LOAD + """
import importlib.util, types
from pathlib import Path
found = importlib.util.find_spec("thingsvision")
package = types.ModuleType("thingsvision_cka")
package.__path__ = [str(Path(found.submodule_search_locations[0]) / "core" / "cka")]
sys.modules["thingsvision_cka"] = package
from thingsvision_cka.cka_numpy import CKANumPy
start = peak()
began = time.perf_counter()
xs, ys = load(a), load(b)
cka = CKANumPy(m=len(xs[0]), kernel="linear", unbiased=False)
values = [[cka.compare(x, y) for y in ys] for x in xs]
""",
    "probe-rsa": """
import probe.analyses.compare
start = peak()
began = time.perf_counter()
values = probe.analyses.compare.compare(a, b, metric="rsa", device=options["device"],
                                        memory_mb=options["memory_mb"],
                                        rdm_samples=options["rsa_rows"], seed=0).matrix()
""",
    "scipy-rsa": _LOAD + """
import scipy.spatial.distance, scipy.stats
start = peak()
began = time.perf_counter()
def ranked(path):  # each condensed RDM ranked once, centred
    layers = load(path)
    layers = [x[rsa_rows(len(x))] for x in layers]
    ranks = [scipy.stats.rankdata(scipy.spatial.distance.pdist(x, "correlation"))
             for x in layers]
    return [r - r.mean() for r in ranks]
def pearson(x, y):  # numpy's pairwise sums: a dot product of 2e6 terms is ~1e-12 off
    return np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y))
rx, ry = ranked(a), ranked(b)
values = [[pearson(x, y) for y in ry] for x in rx]
""",
    "rsatoolbox-rsa": _LOAD + """
import rsatoolbox
start = peak()
began = time.perf_counter()
def rdms(path):
    layers = load(path)
    data = [rsatoolbox.data.Dataset(x[rsa_rows(len(x))]) for x in layers]
    return rsatoolbox.rdm.calc_rdm(data, method="correlation")
values = rsatoolbox.rdm.compare(rdms(a), rdms(b), method="spearman")
""",
}
METHODS = tuple(_CODE)
REFERENCE = {"cka": "numpy-cka", "rsa": "scipy-rsa"}


def make_file(path: Path, rows: int, widths: tuple[int, ...], seed: int) -> Path:
    """A probe file of a layer per width, ``rows`` samples: each layer a noisy nonlinear
    function of a shared latent, so that the CKA values are neither 0 nor 1."""
    import torch

    from probe.file.format import DatasetSpec
    from probe.file.store import Store

    rng = np.random.default_rng(seed)
    latent = np.random.default_rng(0).normal(size=(rows, 32))
    specs = {f"layer{i}/output": DatasetSpec((w,), "float32") for i, w in enumerate(widths)}
    with Store(path, config_yaml="{}", num_rows=rows, datasets=specs, has_target=False,
               attrs={"layers": [f"layer{i}" for i in range(len(widths))]}) as store:
        for start in range(0, rows, 1024):
            stop = min(rows, start + 1024)
            values = {}
            for i, w in enumerate(widths):
                mix = np.random.default_rng([seed, i]).normal(size=(32, w))
                x = np.tanh(latent[start:stop] @ mix / 4) + 0.5 * rng.normal(size=(stop - start,
                                                                                  w))
                values[f"layer{i}/output"] = x.astype(np.float32)
            store.append(torch.arange(start, stop), None, values)
        store.finish()
    return path


def measure(method: str, a: Path, b: Path, options: dict) -> dict:
    """One run of ``method`` in a fresh process: seconds, peak and imports (bytes), values."""
    code = _HEAD + _CODE[method] + _TAIL
    result = subprocess.run([sys.executable, "-c", code, str(a), str(b), json.dumps(options)],
                            capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    if result.returncode:
        raise SystemExit(f"{method} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


def thingsvision_note() -> str | None:
    """Why thingsvision's CKA cannot run here, or None when it can."""
    import importlib.util

    found = importlib.util.find_spec("thingsvision")
    if found is None:
        return "thingsvision is not installed (pip install thingsvision --no-deps)"
    if not (Path(found.submodule_search_locations[0]) / "core" / "cka" / "cka_numpy.py").is_file():
        return "this thingsvision has no core/cka/cka_numpy.py"
    return None


def report(runs: dict[str, list[dict]], mib: float = 2**20) -> list[str]:
    """The table: medians, and each method against its metric's reference."""
    lines = [f"{'method':18}{'seconds':>9}{'x ref':>7}{'peak MiB':>10}{'above imports':>15}"
             f"{'x ref':>7}{'max |diff|':>12}"]
    median = {m: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak", "imports")}
              for m, rs in runs.items()}
    for method, rs in runs.items():
        ref = REFERENCE[method.split("-")[1]]
        m, r = median[method], median.get(ref)
        above = m["peak"] - m["imports"]
        time_ratio = mem_ratio = gap = float("nan")
        if r is not None:
            time_ratio = m["seconds"] / r["seconds"]
            mem_ratio = above / (r["peak"] - r["imports"])
            gap = float(np.abs(np.array(rs[0]["values"])
                               - np.array(runs[ref][0]["values"])).max())
        lines.append(f"{method:18}{m['seconds']:>9.2f}{time_ratio:>7.2f}{m['peak'] / mib:>10.0f}"
                     f"{above / mib:>15.0f}{mem_ratio:>7.2f}{gap:>12.1e}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--memory-mb", type=float, default=2048, help="probe's memory_mb")
    parser.add_argument("--rsa-rows", type=int, default=2000, help="probe's rdm_samples")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every method")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dir", type=Path, default=None, help="where the two files go")
    args = parser.parse_args()
    methods = list(args.methods)
    note = thingsvision_note() if "thingsvision-cka" in methods else None
    if note:
        print(f"thingsvision-cka skipped: {note}")
        methods.remove("thingsvision-cka")
    options = {"device": args.device, "memory_mb": args.memory_mb, "rsa_rows": args.rsa_rows}
    widths = tuple(args.widths)
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        a = make_file(Path(folder) / "a.h5", args.rows, widths, seed=1)
        b = make_file(Path(folder) / "b.h5", args.rows, widths, seed=2)
        size = (a.stat().st_size + b.stat().st_size) / 2**20
        for round_ in range(args.repeat):  # each round in another order
            shift = round_ % len(methods)
            for method in methods[shift:] + methods[:shift]:
                runs[method].append(measure(method, a, b, options))
                print(f"round {round_ + 1}: {method} {runs[method][-1]['seconds']:.2f} s, load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rsa_samples = min(args.rsa_rows, args.rows)
    print(f"{len(widths)} x {len(widths)} layers (widths {', '.join(map(str, widths))}) of two "
          f"files of {args.rows} rows ({size:.0f} MiB of rows together); probe: "
          f"device={args.device}, memory_mb={args.memory_mb:g}; RSA on {rsa_samples} samples; "
          f"medians of {args.repeat}; x ref: against numpy-cka (CKA) and scipy-rsa (RSA)")
    print("\n".join(report(runs)))


if __name__ == "__main__":
    main()
