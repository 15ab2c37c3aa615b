"""Kill a run at its k-th write to its output files, for many k, and check each rerun.

    LD_PRELOAD=killwrite.so python tests/crash/driver.py ROOT SPEC.json
    LD_PRELOAD=killwrite.so python tests/crash/driver.py ROOT SPECS.json    # a list of specs

SPEC holds ``overrides`` (the run's config), ``keys`` (the datasets to compare), which kill
points to try: ``points`` (that many, spread evenly over the run's writes, the first and the
last among them; null: every write), and ``mode`` (``kill``: SIGKILL before the write;
``enospc``: that write and all later ones fail as on a full disk). The process makes the
uninterrupted run itself (so that it imports everything once) and forks a child per run, so a
kill point costs a fraction of a second. Each child that reruns must finish with status 0 and
a file equal to the uninterrupted run's, value for value. Prints one JSON line: the number of
writes, the points tried, and the ones that failed, with the rerun's error (for a list of specs,
a list of those, in order).
"""

from __future__ import annotations

import copy
import ctypes
import json
import os
import shutil
import sys
import threading
import traceback
from pathlib import Path

import torch

torch.set_num_threads(1)  # no OpenMP pool that a forked child would inherit half of

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402

import probe  # noqa: E402
from probe.config.compose import compose  # noqa: E402

tqdm.tqdm.monitor_interval = 0  # no monitor thread, which a forked child would not have
# tqdm's default lock is a semaphore shared by forked processes: a child killed while it held
# it would block every later child; a lock of each process's own cannot be left held
tqdm.tqdm.set_lock(threading.RLock())

_SHIM = ctypes.CDLL(None)  # the preloaded shim's symbols
_SHIM.killwrite_arm.argtypes = [ctypes.c_long, ctypes.c_int]
_SHIM.killwrite_count.restype = ctypes.c_long


_COMPOSED: dict[tuple[str, ...], object] = {}


def _cfg(overrides: list[str], path: Path):
    # composed once, here, before the children fork: each takes a copy with its own path
    key = tuple(overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = compose(list(overrides))
    cfg = copy.deepcopy(_COMPOSED[key])
    cfg.output.path = str(path)
    return cfg


def _in_child(task) -> tuple[int, str]:
    """Run ``task`` in a forked child; its exit status and, if it raised, the error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        import logging

        logging.disable(logging.CRITICAL)
        code, said = 0, ""
        try:
            task()
        except BaseException as err:  # noqa: BLE001  (reported to the parent)
            code = 3
            said = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"
        os.write(write, said.encode()[:4000])
        os._exit(code)
    os.close(write)
    said = os.read(read, 8000).decode(errors="replace")
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return status, said


def _run(overrides: list[str], path: Path, at: int = -1, enospc: bool = False
         ) -> tuple[int, str]:
    def task():
        _SHIM.killwrite_arm(at, int(enospc))
        probe.run(_cfg(overrides, path))
    return _in_child(task)


def _same(reference: Path, path: Path, keys: list[str]) -> str:
    """'' when the two files agree on ``keys``, else what differs."""
    if not path.exists():
        return "no file at the output path"
    with h5py.File(reference, "r") as a, h5py.File(path, "r") as b:
        if not b.attrs["complete"]:
            return "not complete"
        for key in keys:
            left, right = a[key][:], b[key][:]
            numeric = left.dtype.kind in "fc"  # strings and integers have no NaN to match
            if not np.array_equal(left, right, equal_nan=numeric):
                return f"{key} differs"
    return ""


def kill_everywhere(root: Path, spec: dict) -> dict:
    """One spec's kill points (see the module's docstring), in folder ``root``."""
    overrides, keys = list(spec["overrides"]), list(spec["keys"])
    shutil.rmtree(root, ignore_errors=True)
    reference = root / "reference" / "features.h5"
    reference.parent.mkdir(parents=True)
    # the uninterrupted run, here: it also imports, once, what every child would import again
    _SHIM.killwrite_arm(-1, 0)
    probe.run(_cfg(overrides, reference))
    writes = int(_SHIM.killwrite_count())
    wanted = spec.get("points")
    points = (list(range(1, writes + 1)) if wanted is None or wanted >= writes else
              sorted({int(round(p)) for p in np.linspace(1, writes, int(wanted))}))
    failed = []
    for k in points:
        path = root / f"k{k}" / "features.h5"
        path.parent.mkdir()
        _run(overrides, path, k, spec.get("mode") == "enospc")  # killed, or failing
        status, said = _run(overrides, path)
        problem = said.strip() or (f"exit status {status}" if status else "")
        problem = problem or _same(reference, path, keys)
        if problem:
            failed.append({"at": k, "problem": problem[:1500]})
        shutil.rmtree(path.parent)
    return {"writes": writes, "tried": len(points), "failed": failed}


def main() -> None:
    # ROOT SPEC.json: one spec; or ROOT SPECS.json holding a list of them, one process for all
    root, specs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    if isinstance(specs, dict):
        print(json.dumps(kill_everywhere(root, specs)))
        return
    print(json.dumps([kill_everywhere(root / str(n), spec) for n, spec in enumerate(specs)]))


if __name__ == "__main__":
    main()
