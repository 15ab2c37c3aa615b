"""CKA at the floor: the per-pair choice between D x D sums and N x N Grams (by cost, then by
memory) gives the same values either way, the row blocks are read as the plan says, RSA's upper
triangles made in blocks equal scipy's, and memory stays within memory_mb and below the rows
loaded whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import scipy.spatial.distance
import scipy.stats
import torch

from probe.analyses.compare import compare
from probe.analyses.compare.cka import each_block_pair, plan
from probe.analyses.compare.rsa import _mean_ranks, rdm, rdm_upper
from probe.analyses.stats import AlignedRows
from probe.file.read import FeatureFile
from tests.conftest import REPO
from tests.test_compare import cka_debiased_reference, cka_reference, write_probe_file

MIXED = {"wide": 90, "narrow": 5, "small": 6}  # 100 samples


pytestmark = pytest.mark.usefixtures("one_thread")


def _layers(rng, rows, widths, offset=0.0):
    # each layer a noisy nonlinear function of one latent (and a mean far from 0: the shift)
    latent = rng.normal(size=(rows, 4))
    return {f"{name}/output": np.tanh(latent @ rng.normal(size=(4, w))) + offset
            + 0.5 * rng.normal(size=(rows, w)) for name, w in widths.items()}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    layers = _layers(np.random.default_rng(0), 100, MIXED, offset=3.0)
    path = write_probe_file(tmp_path_factory.mktemp("mixed") / "mixed.h5", np.arange(100),
                            layers)
    return path, {k: v.astype(np.float32).astype(np.float64) for k, v in layers.items()}


def _pairs(names):
    return sorted({(a, b) for a in names for b in names if a <= b})


# --- the plan ----------------------------------------------------------------------------------

def test_the_plan_takes_grams_where_they_cost_less():
    # two files of 6 layers: wide layers of few samples share their Grams, narrow layers of
    # many samples are cheaper in D x D sums
    wide = {f"a:{i}": w for i, w in enumerate((64, 512, 4096))}
    wide |= {f"b:{i}": w for i, w in enumerate((64, 512, 4096))}
    cross = sorted({(a, b) for a in wide if a < "b" for b in wide if b > "b"})
    pairs = cross + [(k, k) for k in wide]
    assert plan(wide, pairs, 5000, 2 << 30, "auto") == set(wide)
    assert plan(wide, pairs, 200_000, 2 << 30, "auto") == set()
    # one narrow layer against narrow partners only: its own pairs stay in D x D sums
    lone = {"a:x": 8, "b:y": 8, "b:z": 4096, "a:w": 4096}
    pairs = [("a:x", "b:y"), ("a:w", "b:z"), *((k, k) for k in lone)]
    assert plan(lone, pairs, 5000, 2 << 30, "auto") == {"a:w", "b:z"}


def test_sums_that_outgrow_half_the_budget_move_to_grams(mixed):
    names = [f"a:{k}/output" for k in MIXED]
    widths = {f"a:{k}/output": w for k, w in MIXED.items()}
    assert plan(widths, _pairs(names), 100, 64 << 20, "auto") == set()  # cheapest
    # 0.1 MiB: the 90 x 90 sums do not fit, the narrow ones do
    assert plan(widths, _pairs(names), 100, int(0.1 * 2**20), "auto") == {"a:wide/output"}
    assert plan(widths, _pairs(names), 100, 1, "auto") == set(widths)


@pytest.mark.parametrize("metric", ["cka", "cka_debiased"])
def test_either_accumulation_and_the_mix_give_the_same_values(mixed, metric):
    path, layers = mixed
    found = {label: compare(path, metric=metric, accumulate=accumulate, memory_mb=memory_mb)
             for label, accumulate, memory_mb in [("features", "features", 1),
                                                  ("gram", "gram", 0.1),
                                                  ("gram in one panel", "gram", 64),
                                                  ("mixed", "auto", 0.1)]}
    reference = cka_reference if metric == "cka" else cka_debiased_reference
    keys = found["features"].keys_a
    expected = np.array([[reference(layers[a], layers[b]) for b in keys] for a in keys])
    for label, result in found.items():
        np.testing.assert_allclose(result.matrix(), expected, rtol=0, atol=1e-12,
                                   err_msg=label)


def test_between_two_files_grams_and_sums_agree(tmp_path):
    rng = np.random.default_rng(1)
    widths = {"a": 3, "b": 40, "c": 70}
    paths = [write_probe_file(tmp_path / f"{i}.h5", np.arange(60), _layers(rng, 60, widths))
             for i in range(2)]
    sums = compare(*paths, accumulate="features")
    grams = compare(*paths, accumulate="gram", memory_mb=0.05)  # many panels
    assert not np.allclose(sums.matrix(), 1.0)
    np.testing.assert_allclose(grams.matrix(), sums.matrix(), rtol=0, atol=1e-12)


# --- the blocks ------------------------------------------------------------------------------

def test_every_block_pair_once_and_the_last_block_is_the_next_panel(mixed):
    path, _ = mixed
    with FeatureFile(path) as f:
        reader = AlignedRows({"w": (f, "wide/output")}, {"w": np.arange(100)},
                             torch.device("cpu"))
        reads, seen = [], []
        opened = reader.dataset
        reader.dataset = lambda name: reads.append(name) or opened(name)
        each_block_pair(reader, ["w"], 30, lambda p, b, zp, zb: seen.append((p, b)), {})
    blocks = [(0, 30), (30, 60), (60, 90), (90, 100)]
    assert sorted(seen) == sorted((p, b) for i, p in enumerate(blocks) for b in blocks[i:])
    assert len(reads) == 4 * 5 // 2 - 3  # k(k+1)/2 blocks, less the k-1 kept as panels


def test_rdm_upper_triangle_in_blocks_equals_scipy(mixed):
    path, layers = mixed
    x = layers["wide/output"]
    with FeatureFile(path) as f:
        reader = AlignedRows({"w": (f, "wide/output")}, {"w": np.arange(100)},
                             torch.device("cpu"))
        for budget in (1 << 30, 60_000):  # one panel, and many
            upper = rdm_upper(reader, "w", budget).numpy()
            np.testing.assert_allclose(upper, scipy.spatial.distance.pdist(x, "correlation"),
                                       rtol=0, atol=1e-12)
            square = rdm(reader, "w", budget).numpy()
            np.testing.assert_allclose(square[np.triu_indices(100, 1)], upper, rtol=0, atol=1e-15)
            assert (square == square.T).all() and (np.diag(square) == 0).all()


@pytest.mark.parametrize("memory_mb", [64, 0.06])
def test_rsa_whether_the_ranks_all_stay_or_are_made_again(tmp_path, memory_mb):
    # 64 MiB: every right key's ranks in one block, left keys evicted after their row of
    # pairs; 0.06 MiB: room for 4 ranked triangles, one short of the 4 right keys and the
    # left key in hand, so that ranks are evicted and made again
    rng = np.random.default_rng(4)
    widths = {"a": 3, "b": 8, "c": 20, "d": 50}
    layers = [_layers(rng, 48, widths) for _ in range(2)]
    paths = [write_probe_file(tmp_path / f"{i}.h5", np.arange(48), x)
             for i, x in enumerate(layers)]
    result = compare(*paths, metric="rsa", memory_mb=memory_mb)
    above = np.triu_indices(48, 1)

    def ranks(x):
        r = scipy.stats.rankdata((1 - np.corrcoef(x.astype(np.float32).astype(float)))[above])
        return r - r.mean()

    for (a, b), value in result.values.items():
        x, y = ranks(layers[0][a]), ranks(layers[1][b])
        assert value == pytest.approx(np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y)),
                                      abs=1e-12)


def test_mean_ranks_with_and_without_ties_are_scipys():
    rng = np.random.default_rng(2)
    for values in (rng.normal(size=500), rng.integers(0, 20, size=500).astype(float)):
        np.testing.assert_array_equal(_mean_ranks(torch.from_numpy(values)).numpy(),
                                      scipy.stats.rankdata(values))


# --- memory ----------------------------------------------------------------------------------

_PEAK = """
import json, sys
import probe.analyses.compare as c

def peak():  # the process's high-water mark of resident memory, bytes
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

path, warm, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
c.compare(warm, **options)  # the lazy imports and first allocations, on a small file
before = peak()
c.compare(path, **options)
print(json.dumps({"before": before, "after": peak()}))
"""


def _peak_growth(path, warm, **options):
    result = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(warm),
                             json.dumps(options)], cwd=REPO, capture_output=True, text=True,
                            timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                 # freed blocks go back to the system at once, so the
                                 # high-water mark counts what was alive
                                 "MALLOC_MMAP_THRESHOLD_": "131072"})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    return (found["after"] - found["before"]) / 2**20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Two keys of 1024 features, 4096 samples: 32 MiB of float32 rows, 64 MiB loaded whole
    in float64; and a small file of the same keys to warm up on."""
    folder = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(3)
    paths = {}
    for name, rows in (("warm", 256), ("big", 4096)):
        x = rng.normal(size=(rows, 1024)).astype(np.float32)
        y = np.tanh(x @ rng.normal(size=(1024, 1024)).astype(np.float32) / 32)
        paths[name] = write_probe_file(folder / f"{name}.h5", np.arange(rows),
                                       {"x/output": x, "y/output": y})
    with h5py.File(paths["big"], "r") as f:
        assert f["x/output"].nbytes + f["y/output"].nbytes == 32 << 20
    return paths


@pytest.mark.process
@pytest.mark.parametrize("accumulate", ["auto", "gram"])
def test_memory_stays_within_memory_mb(big, accumulate):
    grown = _peak_growth(big["big"], big["warm"], memory_mb=8, accumulate=accumulate)
    assert grown < 8 + 2, grown  # and a few int64 a row


@pytest.mark.process
def test_a_large_budget_holds_less_than_the_rows_loaded_whole(big):
    # memory_mb=2048 would hold the 64 MiB of float64 rows; the blocks take at most half
    grown = _peak_growth(big["big"], big["warm"], accumulate="gram")
    assert grown < 64 * 0.75, grown
