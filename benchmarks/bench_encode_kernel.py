"""One wide key's encoding model by each of probe's solvers in turn, on the same file:

    python benchmarks/bench_encode_kernel.py                   # auto (kernel), himalaya, streamed
    python benchmarks/bench_encode_kernel.py auto streamed

1500 rows of 2048 random features, 100 target columns (50 features mapped, plus noise); probe's
scheme (5 outer folds, an inner search over the other 4, the 10 default penalties). Prints each
solver's seconds and score (the scores must agree). A first look, before bench_encode.py.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from probe.analyses.encode import encode  # noqa: E402
from tests.test_compare import write_probe_file  # noqa: E402


def main(solvers: list[str]) -> None:
    rng = np.random.default_rng(0)
    n, p, v = 1500, 2048, 100
    x = rng.normal(size=(n, p)).astype(np.float32)
    with tempfile.TemporaryDirectory() as folder:
        path = write_probe_file(Path(folder) / "wide.h5", np.arange(n), {"a/output": x},
                                layers=["a"])
        targets = x[:, :50] @ rng.normal(size=(50, v)) + 5 * rng.normal(size=(n, v))
        np.save(Path(folder) / "targets.npy", targets)
        for solver in solvers:
            began = time.perf_counter()
            result = encode(path, Path(folder) / "targets.npy", solver=solver,
                            max_features=4096)[0]
            print(f"{solver:9s} {time.perf_counter() - began:6.1f} s  score "
                  f"{result['score']:.6f}  ({result['solver']})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["auto", "himalaya", "streamed"])
