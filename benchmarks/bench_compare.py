"""CKA between all pairs of 6 layers of two 20k-row files: probe.analyses.compare against the
in-memory numpy computation, which must load both files first.

    python benchmarks/bench_compare.py                      # about two minutes on 2 CPU cores
    python benchmarks/bench_compare.py --rows 5000          # a quicker look
    python benchmarks/bench_compare.py --device cuda        # probe's sums on a GPU

Both sides compute the same 36 values in float64 (the feature-space form
``||Xcᵀ Yc||_F² / (||Xcᵀ Xc||_F ||Ycᵀ Yc||_F)``; the script checks that they agree) and each
runs in a fresh process, so that its peak resident memory (VmHWM) is its own; the seconds are
those of the computation, after the imports. The machine may be shared and noisy: compare the
ratios, which come from one run of each side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's probe, as the measured processes use
WIDTHS = (64, 128, 256, 256, 512, 1024)  # six layers, as mean-pooled conv features are

_PEAK = ("def peak():\n"
         "    text = open('/proc/self/status').read()\n"
         "    return int(text.split('VmHWM:')[1].split()[0]) * 1024\n")

_PROBE = _PEAK + """
import json, sys, time
import probe.analyses.compare
start = peak()
began = time.perf_counter()
result = probe.analyses.compare.compare(sys.argv[1], sys.argv[2], metric="cka", device=sys.argv[3],
                               memory_mb=float(sys.argv[4]))
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "peak": peak(), "imports": start,
                  "values": result.matrix().tolist()}))
"""

_NUMPY = _PEAK + """
import json, sys, time
import h5py, numpy as np
start = peak()
began = time.perf_counter()
def load(path):  # every layer, centred, in float64
    with h5py.File(path, "r") as f:
        keys = [f"layer{i}/output" for i in range(len(f.attrs["layers"]))]
        rows = [f[k][:].astype(np.float64) for k in keys]
    return [x - x.mean(0) for x in rows]
xs, ys = load(sys.argv[1]), load(sys.argv[2])
norm_x = [np.linalg.norm(x.T @ x) for x in xs]
norm_y = [np.linalg.norm(y.T @ y) for y in ys]
values = [[np.linalg.norm(x.T @ y) ** 2 / (nx * ny) for y, ny in zip(ys, norm_y)]
          for x, nx in zip(xs, norm_x)]
seconds = time.perf_counter() - began
print(json.dumps({"seconds": seconds, "peak": peak(), "imports": start, "values": values}))
"""


def make_file(path: Path, rows: int, seed: int) -> Path:
    """A probe file of six layers of ``rows`` samples: each layer a noisy nonlinear function
    of a shared latent, so that the CKA values are neither 0 nor 1."""
    import torch

    from probe.file.format import DatasetSpec
    from probe.file.store import Store

    rng = np.random.default_rng(seed)
    latent = np.random.default_rng(0).normal(size=(rows, 32))
    specs = {f"layer{i}/output": DatasetSpec((w,), "float32") for i, w in enumerate(WIDTHS)}
    with Store(path, config_yaml="{}", num_rows=rows, datasets=specs, has_target=False,
               attrs={"layers": [f"layer{i}" for i in range(len(WIDTHS))]}) as store:
        for start in range(0, rows, 4096):
            stop = min(rows, start + 4096)
            values = {}
            for i, w in enumerate(WIDTHS):
                mix = np.random.default_rng([seed, i]).normal(size=(32, w))
                x = np.tanh(latent[start:stop] @ mix / 4) + 0.5 * rng.normal(size=(stop - start,
                                                                                  w))
                values[f"layer{i}/output"] = x.astype(np.float32)
            store.append(torch.arange(start, stop), None, values)
        store.finish()
    return path


def run(code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if result.returncode:
        raise SystemExit(result.stderr)
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-mb", type=float, default=256)
    parser.add_argument("--dir", type=Path, default=None, help="where the two files go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        a = make_file(Path(folder) / "a.h5", args.rows, seed=1)
        b = make_file(Path(folder) / "b.h5", args.rows, seed=2)
        size = (a.stat().st_size + b.stat().st_size) / 2**20
        ours = run(_PROBE, str(a), str(b), args.device, str(args.memory_mb))
        theirs = run(_NUMPY, str(a), str(b))
    gap = np.abs(np.array(ours["values"]) - np.array(theirs["values"])).max()
    assert gap < 1e-9, f"the two sides disagree by {gap}"
    mib = 2**20
    print(f"CKA, 6 x 6 layers (widths {', '.join(map(str, WIDTHS))}) of two files of "
          f"{args.rows} rows ({size:.0f} MiB of rows together), device={args.device}, "
          f"memory_mb={args.memory_mb:g}; values agree to {gap:.1e}")
    print(f"{'':24}{'seconds':>10}{'peak RSS MiB':>15}{'above imports':>15}")
    for name, side in (("probe.compare", ours), ("numpy, files loaded", theirs)):
        print(f"{name:24}{side['seconds']:>10.2f}{side['peak'] / mib:>15.0f}"
              f"{(side['peak'] - side['imports']) / mib:>15.0f}")
    print(f"ratio (probe / numpy): time {ours['seconds'] / theirs['seconds']:.2f}, peak "
          f"{ours['peak'] / theirs['peak']:.2f}, above imports "
          f"{(ours['peak'] - ours['imports']) / (theirs['peak'] - theirs['imports']):.2f}")


if __name__ == "__main__":
    main()
