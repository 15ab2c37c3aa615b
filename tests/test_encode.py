"""Encoding models: the layer a target was made from scores best, noise scores near zero, the
streamed sums give himalaya's numbers, targets pair with samples by /index, memory stays flat
out of core, and wrong inputs are one line."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.analyses.encode import encode
from probe.analyses.encode.projection import SparseProjection
from probe.errors import ConfigError
from tests.conftest import REPO, TINY_NET, cli, compose_cfg, compose_command, error_line
from tests.test_compare import write_probe_file

DATASET = 300  # samples in the made-up dataset; the file holds 240 of them
SIGNAL, NOISE = 6, 20  # target columns made from "middle", and of pure noise


# small matrices gain nothing from threads (tests/conftest.py one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    """A file of three layers, each a nonlinear function of the one before, and a wide one
    (the middle layer among 300 noise features), for 240 of 300 samples; targets whose first 6
    columns are a linear map of the middle layer plus noise, the other 20 pure noise."""
    folder = tmp_path_factory.mktemp("encode")
    rng = np.random.default_rng(0)
    index = np.sort(rng.choice(DATASET, 240, replace=False))
    early = rng.normal(size=(240, 12))
    middle = np.maximum(early @ rng.normal(size=(12, 24)), 0) + 0.1 * rng.normal(size=(240, 24))
    late = np.tanh(middle @ rng.normal(size=(24, 8)) / 4)
    wide = np.concatenate([middle, rng.normal(size=(240, 300))], 1)
    path = write_probe_file(folder / "layered.h5", index, {
        "early/output": early, "middle/output": middle, "late/output": late,
        "wide/output": wide}, layers=["early", "middle", "late", "wide"])
    with h5py.File(path, "r+") as f:  # as a run records its dataset
        f.attrs["data_fingerprint"] = json.dumps({"length": DATASET})
    signal = middle @ rng.normal(size=(24, SIGNAL))
    signal += 0.3 * signal.std(0) * rng.normal(size=signal.shape)
    targets = rng.normal(size=(DATASET, SIGNAL + NOISE))
    targets[index, :SIGNAL] = signal  # row i of the targets is dataset sample i
    np.save(folder / "targets.npy", targets)
    with h5py.File(folder / "targets.h5", "w") as f:
        f["bold/roi"] = targets
    return {"file": path, "targets": folder / "targets.npy", "h5": folder / "targets.h5",
            "folder": folder}


def _by_key(results):
    return {r["key"].split("/")[0]: r for r in results}


def test_the_layer_the_targets_came_from_scores_best_and_noise_near_zero(layered):
    signal = np.zeros(SIGNAL + NOISE, dtype=bool)
    signal[:SIGNAL] = True
    results = _by_key(encode(layered["file"], layered["targets"], max_features=64))
    assert list(results) == ["early", "middle", "late", "wide"]  # the model's order
    scores = {name: r["r"][signal].mean() for name, r in results.items()}
    assert scores["middle"] > 0.85, scores
    assert scores["middle"] > max(scores["early"], scores["late"]) + 0.05, scores
    for name, r in results.items():
        assert abs(r["r"][~signal].mean()) < 0.06, (name, r["r"][~signal])
        assert r["score"] == pytest.approx(r["r"].mean()) and r["fold_r"].shape == (5, 26)
        assert r["solver"] == "streamed"  # fewer features than training rows: XᵀX is smaller
    # the wide layer holds the middle one among noise features, seen through 64 projections
    assert results["wide"]["features"] == 64 and results["wide"]["input_features"] == 324
    assert 0.3 < scores["wide"] < scores["middle"]  # seen, blurred by the noise features


@pytest.mark.parametrize("memory_mb", [64, 0.2])
def test_streamed_sums_give_himalayas_numbers(layered, memory_mb):
    # 0.2 MiB: blocks of a few rows, and the target columns in several batches
    keys = ["early", "middle", "wide"]
    ours = encode(layered["file"], layered["targets"], keys, max_features=40,
                  solver="streamed", memory_mb=memory_mb)
    theirs = encode(layered["file"], layered["targets"], keys, max_features=40,
                    solver="himalaya")
    for a, b in zip(ours, theirs, strict=True):
        assert (a["solver"], b["solver"]) == ("streamed", "himalaya")
        np.testing.assert_allclose(a["fold_r"], b["fold_r"], rtol=1e-7, atol=1e-9)
        np.testing.assert_array_equal(a["alpha"], b["alpha"])
        assert a["score"] == pytest.approx(b["score"], rel=1e-8)
    # the alphas were chosen per target, not one for all: signal and noise want others
    assert len(np.unique(ours[1]["alpha"])) > 1


@pytest.mark.parametrize("memory_mb", [64, 2])
def test_the_kernel_form_gives_the_streamed_and_himalaya_numbers(layered, memory_mb, caplog):
    # "wide" has 324 features and 192 training rows per outer fold: auto takes the kernel
    # form, whose eigendecompositions are of the rows' size; 2 MiB: its Gram in panels
    with caplog.at_level(logging.INFO, logger="probe.analyses.encode"):
        kernel = encode(layered["file"], layered["targets"], ["wide", "middle"],
                        memory_mb=memory_mb)
    assert [r["solver"] for r in kernel] == ["kernel", "streamed"]
    assert "wide/output: solver=kernel (324 features > 192 training rows" in caplog.text
    assert "middle/output: solver=streamed (24 features <= 192 training rows)" in caplog.text
    with caplog.at_level(logging.INFO, logger="probe.analyses.encode"):
        streamed = encode(layered["file"], layered["targets"], ["wide"], solver="streamed")[0]
    assert "wide/output: solver=streamed (as asked: solver=streamed)" in caplog.text
    theirs = encode(layered["file"], layered["targets"], ["wide"], solver="himalaya")[0]
    for other in (streamed, theirs):
        np.testing.assert_allclose(kernel[0]["fold_r"], other["fold_r"], rtol=1e-7, atol=1e-9)
        np.testing.assert_array_equal(kernel[0]["alpha"], other["alpha"])
    assert kernel[0]["features"] == 324 and "projection" not in kernel[0]


def test_solvers_that_would_outgrow_memory_mb_are_refused(layered):
    with pytest.raises(ConfigError, match="solver=kernel holds a 240 x 240 Gram matrix"):
        encode(layered["file"], layered["targets"], ["wide"], solver="kernel", memory_mb=0.5)
    with pytest.raises(ConfigError, match="solver=himalaya holds wide/output's rows"):
        encode(layered["file"], layered["targets"], ["wide"], solver="himalaya", memory_mb=0.5)
    # auto falls back to the streamed sums when the Gram matrix does not fit, and says what
    # those need
    with pytest.raises(ConfigError, match="streamed ridge of wide/output .* raise memory_mb"
                       ) as raised:
        encode(layered["file"], layered["targets"], ["wide"], memory_mb=0.9)
    # and the memory_mb it names is enough
    enough = float(re.search(r"memory_mb=([0-9.e+]+) or more", str(raised.value)).group(1))
    assert encode(layered["file"], layered["targets"], ["wide"], memory_mb=enough * 1.01)


def test_alpha_is_chosen_from_the_grid_given(layered):
    one = encode(layered["file"], layered["targets"], ["middle"], alphas=[10.0],
                 solver="streamed")[0]
    assert (one["alpha"] == 10.0).all()
    grid = encode(layered["file"], layered["targets"], ["middle"], alphas=[1e-3, 1e9],
                  solver="streamed")[0]
    assert set(np.unique(grid["alpha"])) <= {1e-3, 1e9}


def test_targets_from_an_hdf5_dataset_are_the_npy_ones(layered):
    from_npy = encode(layered["file"], layered["targets"], ["late"], solver="streamed")
    from_h5 = encode(layered["file"], f"{layered['h5']}:bold/roi", ["late"], solver="streamed")
    np.testing.assert_array_equal(from_npy[0]["fold_r"], from_h5[0]["fold_r"])


def test_projection_is_seeded_and_keeps_lengths():
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(50, 2000)))
    projected = SparseProjection(2000, 400, seed=0, device=torch.device("cpu"))(x)
    ratio = projected.norm(dim=1) / x.norm(dim=1)
    assert projected.shape == (50, 400) and ((ratio > 0.8) & (ratio < 1.2)).all(), ratio
    again = SparseProjection(2000, 400, seed=0, device=torch.device("cpu"))(x)
    other = SparseProjection(2000, 400, seed=1, device=torch.device("cpu"))(x)
    assert torch.equal(projected, again) and not torch.allclose(projected, other)


def test_rows_of_a_real_run_pair_with_targets_by_index(tmp_path):
    # a random 40 of 64 samples: the file's row k is dataset sample index[k]
    path = probe.run(compose_cfg(*TINY_NET, "layers=[features.3,fc]", "reduce=mean",
                                 "dataset.num_samples=64", "limit=40", "subset=random",
                                 "dataset.image_size=16", "batch_size=20",
                                 output=tmp_path / "run.h5", tiny=False))
    with h5py.File(path, "r") as f:
        index, fc = f["index"][:], f["fc/output"][:].astype(np.float64)
    assert not np.array_equal(index, np.arange(40))
    rng = np.random.default_rng(0)
    signal = fc @ rng.normal(size=(10, 3))
    signal += 0.2 * signal.std(0) * rng.normal(size=signal.shape)
    targets = rng.normal(size=(64, 3))
    targets[index] = signal
    np.save(tmp_path / "by_sample.npy", targets)
    targets_by_row = rng.normal(size=(64, 3))
    targets_by_row[:40] = signal  # what pairing by row position would need
    np.save(tmp_path / "by_row.npy", targets_by_row)
    right = encode(path, tmp_path / "by_sample.npy", ["fc"], folds=4)[0]
    wrong = encode(path, tmp_path / "by_row.npy", ["fc"], folds=4)[0]
    assert right["score"] > 0.85 > 0.3 > wrong["score"], (right["score"], wrong["score"])


def _command(capsys, *overrides):
    from probe.analyses.encode.config import EncodeConfig
    from probe.commands.encode import _encode

    cfg = compose_command("encode", *overrides, schema=EncodeConfig)
    return _encode(cfg)


def test_the_command_writes_the_csv_the_scores_and_the_plot(layered, tmp_path, capsys):
    _command(capsys, f"file={layered['file']}", f"targets={layered['targets']}",
             "keys=[early,middle]", f"out_dir={tmp_path}/out", "folds=4")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["key", "score", "features", "solver"]
    with (tmp_path / "out" / "encoding.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert [r["key"] for r in rows] == ["early/output", "middle/output"]
    assert list(rows[0]) == ["key", "score"]
    with h5py.File(tmp_path / "out" / "scores.h5", "r") as f:
        for row in rows:
            r = f[f"r/{row['key']}"]
            assert r.shape == (26,) and float(row["score"]) == pytest.approx(r[:].mean())
            assert f[f"alpha/{row['key']}"].shape == f[f"fold_r/{row['key']}"].shape == (4, 26)
            assert r.attrs["solver"] == "streamed"
        assert f.attrs["folds"] == 4 and len(f.attrs["alphas"]) == 10
    assert (tmp_path / "out" / "encoding.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_user_error_is_one_line_and_exit_1(layered, tmp_path, capsys):
    file, targets, out = layered["file"], layered["targets"], f"out_dir={tmp_path}/out"
    np.save(tmp_path / "short.npy", np.zeros((250, 3)))
    np.save(tmp_path / "nan.npy", np.full((DATASET, 2), np.nan))
    np.save(tmp_path / "text.npy", np.array(["a"] * DATASET))
    np.save(tmp_path / "empty.npy", np.zeros((DATASET, 0)))
    tokens = write_probe_file(tmp_path / "tokens.h5", np.arange(3),
                              {"h/output": np.ones((7, 2))}, token_lengths=[2, 2, 3])
    errors = {
        "file is not set": [],
        "targets is not set": [f"file={file}"],
        "has 250 rows, but the dataset of": [f"file={file}", f"targets={tmp_path}/short.npy"],
        "has 300 samples": [f"file={file}", f"targets={tmp_path}/short.npy"],
        "'layer9/output' is not in": [f"file={file}", f"targets={targets}", "keys=[layer9]"],
        "hold one row per token (tokens=all)": [f"file={tokens}", f"targets={targets}"],
        "folds=2 must be at least 3": [f"file={file}", f"targets={targets}", "folds=2"],
        "must be one or more positive penalties": [f"file={file}", f"targets={targets}",
                                                   "alphas=[0,1]"],
        "solver='ridge': use auto, streamed, kernel or himalaya": [f"file={file}",
                                                                   f"targets={targets}",
                                                                   "solver=ridge"],
        "max_features=0 must be at least 1": [f"file={file}", f"targets={targets}",
                                              "max_features=0"],
        "does not exist; pass a .npy file": [f"file={file}", f"targets={tmp_path}/no.npy"],
        "is an HDF5 file; name its dataset": [f"file={file}", f"targets={layered['h5']}"],
        "has no dataset 'bold/v1'; it holds ['bold/roi']": [
            f"file={file}", f"targets={layered['h5']}:bold/v1"],
        "use a .npy file (N, V) or an HDF5 dataset": [f"file={file}", "targets=t.csv"],
        "holds NaN or an infinity in row": [f"file={file}", f"targets={tmp_path}/nan.npy"],
        "not numbers": [f"file={file}", f"targets={tmp_path}/text.npy"],
        "has no columns (shape (300, 0))": [f"file={file}", f"targets={tmp_path}/empty.npy"],
        "needs memory_mb=": [f"file={file}", f"targets={targets}", "solver=streamed",
                        "memory_mb=0.001", "keys=[wide]"],
    }
    for message, overrides in errors.items():
        with pytest.raises(SystemExit) as stopped:
            _command(capsys, *overrides, out)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("probe: error:")]
        assert stopped.value.code == 1 and len(lines) == 1, (message, err)
        assert message in lines[0], (message, lines[0])
    assert not (tmp_path / "out").exists()


def test_targets_of_another_length_fail_in_one_line_from_the_shell(layered, tmp_path):
    np.save(tmp_path / "short.npy", np.zeros((250, 3)))
    result = cli(f"file={layered['file']}", f"targets={tmp_path}/short.npy",
                     cwd=tmp_path, module="probe.encode")
    line = error_line(result)
    assert "has 250 rows" in line and "has 300 samples" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.npy"]


def test_missing_cuda_is_an_error(layered):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(probe.ProbeError, match="no CUDA device is available"):
        encode(layered["file"], layered["targets"], device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("solver", ["himalaya", "streamed", "kernel"])
def test_cuda_gives_the_cpu_numbers(layered, solver):
    on_cpu = encode(layered["file"], layered["targets"], max_features=64, solver=solver)
    on_gpu = encode(layered["file"], layered["targets"], max_features=64, solver=solver,
                    device="cuda")
    for a, b in zip(on_cpu, on_gpu, strict=True):
        np.testing.assert_allclose(a["fold_r"], b["fold_r"], rtol=1e-6, atol=1e-8)


# --- out of core -----------------------------------------------------------------------------

_MEASURE = """
import json, sys
import probe.analyses.compare, probe.analyses.encode

def peak():  # the process's high-water mark of resident memory, bytes
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

found = {}
for name, targets in json.loads(sys.argv[1]):
    c = probe.analyses.compare.compare(name, memory_mb=8)
    e = probe.analyses.encode.encode(name, targets, memory_mb=8, folds=3)
    found[name] = {"peak": peak(), "solver": e[0]["solver"], "cka": c.values[("a/output",
                   "b/output")], "score": e[0]["score"]}
print(json.dumps(found))
"""


@pytest.mark.process
def test_out_of_core_memory_stays_flat_for_a_file_4x_the_budget(tmp_path):
    # memory_mb=8; files of 8 MiB (the warm-up's), 8 MiB and 32 MiB of rows: the 32 MiB file
    # runs last, so its peak is the process's; loading it would add 24 MiB or more, while the
    # bookkeeping of its rows (index, folds: a few int64 a row) adds a fraction of one
    rng = np.random.default_rng(0)
    runs = []
    for name, rows in (("warm", 4096), ("1x", 4096), ("4x", 16384)):
        x = rng.normal(size=(rows, 256)).astype(np.float32)
        y = (x @ rng.normal(size=(256, 256)) / 16).astype(np.float32)
        path = write_probe_file(tmp_path / f"{name}.h5", np.arange(rows),
                                {"a/output": x, "b/output": y})
        np.save(tmp_path / f"{name}.npy", x[:, :4] + 0.5 * rng.normal(size=(rows, 4)))
        runs.append((str(path), str(tmp_path / f"{name}.npy")))
    sizes = {name: (tmp_path / f"{name}.h5").stat().st_size for name in ("1x", "4x")}
    assert sizes["4x"] > 4 * 8 << 20
    result = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(runs)], cwd=REPO,
                            capture_output=True, text=True, timeout=1800,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                 # freed blocks go back to the system at once, so the
                                 # high-water mark counts what was alive, not what malloc kept
                                 "MALLOC_MMAP_THRESHOLD_": "131072"})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    one, four = found[runs[1][0]], found[runs[2][0]]
    assert one["solver"] == four["solver"] == "streamed"  # the rows do not fit in 8 MiB
    grown = four["peak"] - one["peak"]
    assert grown < (sizes["4x"] - sizes["1x"]) / 8, (grown, sizes)
    # the answers are still right: b is a linear map of a, the targets noisy copies of a
    assert 0.2 < four["cka"] < 0.99 and four["score"] > 0.8
