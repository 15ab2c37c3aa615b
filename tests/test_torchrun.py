"""``torchrun --nproc-per-node=2 -m probe``: two ranks on the CPU (gloo) write one file equal to
one process's run, rows matched by /index; a relaunch resumes every rank and a finished run
does nothing; a rank that fails ends the command with its one line and status 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import probe
from tests.conftest import REPO, TINY_NET, compose_cfg

# batch_size=1: each sample is computed alone in every run, so values match bit for bit
RUN = [*TINY_NET, "layers=[features.0,fc]", "dataset._target_=tests.tiny.PacedImages",
       "dataset.image_size=16", "batch_size=1", "output.commit_every=1"]
KEYS = ("target", "features.0/output", "fc/output")


def _command(ranks: int, *args: str) -> list[str]:
    flags = [a for a in args if a == "-m"]  # Hydra's flags go before the overrides
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "-m",
            "probe", *flags, *RUN, *(a for a in args if a not in flags)]


def _env() -> dict:
    # no progress bar: its carriage returns would share a line with another rank's message
    return {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0",
            "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}


def torchrun(*args: str, cwd, ranks: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(_command(ranks, *args), cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=1800)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def probe_lines(stderr: str, kind: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"probe: {kind}")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process's runs, by sample count (in this process: the values do not depend on it)."""
    directory = tmp_path_factory.mktemp("reference")
    done = {}

    def get(samples: int, *extra: str):
        key = (samples, *extra)
        if key not in done:
            done[key] = probe.run(compose_cfg(*RUN, f"dataset.num_samples={samples}", *extra,
                                              output=directory / f"{len(done)}.h5", tiny=False))
        return done[key]

    return get


def assert_equal_by_index(path, reference) -> None:
    """Every row of ``path`` holds what the reference holds for the same sample."""
    with h5py.File(path, "r") as a, h5py.File(reference, "r") as b:
        assert a.attrs["complete"] and sorted(a["index"][:]) == list(b["index"][:])
        where = {int(sample): row for row, sample in enumerate(b["index"][:])}
        rows = [where[int(sample)] for sample in a["index"][:]]
        for key in KEYS:
            np.testing.assert_array_equal(a[key][:], b[key][:][rows], err_msg=key)


@pytest.mark.process
def test_two_ranks_equal_one_process_and_a_second_launch_does_nothing(tmp_path, reference):
    first = torchrun("dataset.num_samples=9", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (folder,) = (tmp_path / "outputs").iterdir()  # both ranks found the same run folder
    out = folder / "features.h5"
    assert_equal_by_index(out, reference(9))
    with h5py.File(out, "r") as f:
        assert f["fc/output"].is_virtual and (f.attrs["shard_index"], f.attrs["shard_count"]) \
            == (0, 1)
        assert [os.path.basename(p) for p in f.attrs["merged_from"]] == [
            "features.rank-0-of-2.h5", "features.rank-1-of-2.h5"]
    with probe.open(out) as f:  # through probe too: complete, the shards where they belong
        assert f.num_rows == 9 and f.index.tolist() == list(range(9))
    # Hydra's own files are rank 0's; rank 1 logged to its own file
    assert sorted(p.name for p in folder.iterdir()) == [
        ".hydra", "features.h5", "features.rank-0-of-2.h5", "features.rank-1-of-2.h5",
        "probe.log", "probe.rank-1.log"]
    assert "rank 1 of 2: shard 1 of 2" in (folder / "probe.rank-1.log").read_text()
    assert "rank 1 of 2" not in (folder / "probe.log").read_text()

    files = sorted(p.name for p in folder.iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.h5")}
    again = torchrun("dataset.num_samples=9", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already complete for this config; nothing to do" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("*.h5")} == before
    assert sorted(p.name for p in folder.iterdir()) == files


@pytest.mark.process
def test_a_failing_rank_gives_its_one_line_and_status_1(tmp_path):
    # rank 1 takes the odd samples; sample 21, its 11th, cannot be read: rank 0 (0.1 s a
    # sample, 30 of them) is still at work then
    result = torchrun("dataset.num_samples=60", "dataset._target_=tests.tiny.BrokenImages",
                      "+dataset.broken=21", "+dataset.delay=0.1", "output.path=out/f.h5",
                      cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert probe_lines(result.stderr, "error") == ["probe: error: sample 21 cannot be read"]
    # torchrun's summary of the failure names it too
    assert "traceback : probe: error: sample 21 cannot be read" in result.stderr
    # the other rank got torchrun's SIGTERM and stopped at a batch boundary, its rows committed
    stops = probe_lines(result.stderr, "stopped")
    assert len(stops) == 1, result.stderr
    stopped = stops[0]
    assert stopped.startswith("probe: stopped by SIGTERM with ") and stopped.endswith(
        "rows saved in {}; run the same command again to resume".format(
            tmp_path / "out" / "f.rank-0-of-2.h5.partial"))
    saved = int(stopped.split(" with ")[1].split(" of ")[0])
    with probe.open(tmp_path / "out" / "f.rank-0-of-2.h5", allow_partial=True) as f:
        assert 0 < saved == f.num_rows < 30 and not f.complete
        assert f.index.tolist() == list(range(0, 2 * saved, 2))
    assert not (tmp_path / "out" / "f.h5").exists()


@pytest.mark.process
def test_a_config_error_that_every_rank_meets_reads_as_one_line(tmp_path):
    result = torchrun("dataset.num_samples=4", "layers=[nope]", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    (line,) = probe_lines(result.stderr, "error")
    assert line.startswith("probe: error: layer 'nope' matches no module")
    assert not (tmp_path / "outputs").exists()  # the run folder it made is gone again


def test_torchruns_environment_makes_ranks(monkeypatch):
    from probe.commands.ranks import Ranks, from_environment

    for name, value in {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert from_environment() == Ranks(rank=1, count=4, local_rank=1)
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun of one process: a plain run
    assert from_environment() is None
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert from_environment() is None


def test_ranks_but_0_leave_hydras_files_to_rank_0(monkeypatch):
    from probe.commands.ranks import Ranks, prepare

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert prepare(Ranks(0, 2, 0), []) == [] and "TQDM_DISABLE" not in os.environ
    extra = prepare(Ranks(1, 2, 1), ["model=vgg16"])
    assert extra == ["hydra.output_subdir=null", "hydra.job_logging.handlers.file.filename="
                     "${hydra.runtime.output_dir}/${hydra.job.name}.rank-1.log"]
    assert os.environ["TQDM_DISABLE"] == "1"
    # a logging config of the user's own has no file handler to rename, perhaps
    assert prepare(Ranks(1, 2, 1), ["hydra/job_logging=disabled"]) == [
        "hydra.output_subdir=null"]


@pytest.mark.skipif(_cuda_devices() > 0, reason="the CPU-only case")
def test_a_rank_without_cuda_keeps_the_device_asked_for():
    from probe.commands.ranks import rank_device

    # auto finds the CPU (or MPS) in the plan; cuda is refused there, in its own words
    assert [rank_device(d, 1) for d in ("auto", "cpu", "cuda", "cuda:0")] == [
        "auto", "cpu", "cuda", "cuda:0"]


def test_a_launch_with_another_number_of_ranks_is_named(tmp_path, caplog):
    from probe.commands.ranks import _warn_about_other_launches

    for name in ("f.rank-0-of-4.h5", "f.rank-1-of-4.h5.partial", "f.rank-0-of-2.h5"):
        (tmp_path / name).touch()
    with caplog.at_level("WARNING"):
        _warn_about_other_launches(tmp_path / "f.h5", 2)
        _warn_about_other_launches(tmp_path / "f.h5", 4)
    first, second = (r.getMessage() for r in caplog.records)
    assert "another number of ranks (f.rank-0-of-4.h5, f.rank-1-of-4.h5)" in first
    assert "launch of 2 does not use them" in first
    assert "(f.rank-0-of-2.h5)" in second


def _killed_and_resumed(tmp_path, reference, samples: int, *extra: str) -> int:
    """Start two ranks, SIGKILL rank 1 once it has committed rows, check that the command
    fails and rank 0 stops with its rows committed, then launch it again to the end; the rows
    rank 1 resumed after."""
    out = tmp_path / "out" / "f.h5"
    args = (f"dataset.num_samples={samples}", "+dataset.delay=0.05", f"output.path={out}",
            *extra)
    process = subprocess.Popen(_command(2, *args), cwd=tmp_path, env=_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lock = out.with_name("f.rank-1-of-2.h5.lock")
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.read_text()):
        assert time.monotonic() < deadline and process.poll() is None, "rank 1 never started"
        time.sleep(0.05)
    time.sleep(1.0)  # about 20 of its samples
    os.kill(json.loads(lock.read_text())["pid"], signal.SIGKILL)
    _, stderr = process.communicate(timeout=1800)
    assert process.returncode == 1, stderr
    assert "exitcode  : -9" in stderr
    stops = probe_lines(stderr, "stopped")
    assert len(stops) == 1 and stops[0].startswith("probe: stopped by SIGTERM with "), stderr

    again = torchrun(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    log = (tmp_path / "outputs").glob("*/probe.rank-1.log")
    resumed = [int(line.split(" after ")[1].split()[0]) for path in log
               for line in path.read_text().splitlines() if "resuming" in line]
    assert_equal_by_index(out, reference(samples))
    return resumed[-1]


@pytest.mark.slow
def test_a_killed_rank_resumes_and_the_file_equals_one_process(tmp_path, reference):
    assert _killed_and_resumed(tmp_path, reference, 60) > 0


@pytest.mark.slow
def test_nodes_nest_each_with_its_ranks_and_merge_into_one_run(tmp_path, reference):
    # two "nodes" (shard.count=2), each a torchrun of two ranks, then a merge of their files
    nodes = []
    for c in range(2):
        result = torchrun("dataset.num_samples=11", "shard.count=2", f"shard.index={c}",
                          cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (node,) = (tmp_path / "outputs").glob(f"*shard.index-{c}*/features.h5")
        with probe.open(node) as f:
            assert (f.config.shard.index, f.config.shard.count) == (c, 2)
            assert f.index.tolist() == list(range(c, 11, 2))
        nodes.append(node)
    merged = subprocess.run([sys.executable, "-m", "probe.merge", "-o", "all.h5", *map(str, nodes)],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    assert "merged 4 shards, 11 rows" in merged.stderr
    assert_equal_by_index(tmp_path / "all.h5", reference(11))


@pytest.mark.slow
def test_a_sharded_multirun_under_torchrun_merges_once_into_one_run(tmp_path, reference):
    # each job of the sweep is a shard whose two ranks split it further; rank 0 alone runs the
    # sweep's merge callback
    result = torchrun("-m", "dataset.num_samples=11", "shard.count=2", "shard.index=range(2)",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (merged,) = (tmp_path / "outputs" / "multirun").glob("*.h5")
    assert "shard.count-2" in merged.name and "shard.index" not in merged.name
    assert_equal_by_index(merged, reference(11))
    assert result.stdout.count("merged 4 shards, 11 rows") == 1, result.stdout
    assert "not merging" not in result.stdout, result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_devices() < 2, reason="needs two CUDA devices")
def test_two_ranks_on_two_gpus_equal_one_process_on_one(tmp_path):
    # device=auto: rank r on cuda:r; the single process on cuda:0 (TF32 alike on both sides)
    result = torchrun("dataset.num_samples=64", "output.path=two/f.h5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (folder,) = (tmp_path / "outputs").iterdir()
    assert "on cuda:0" in (folder / "probe.log").read_text()
    assert "on cuda:1" in (folder / "probe.rank-1.log").read_text()
    single = subprocess.run([sys.executable, "-m", "probe", *RUN, "dataset.num_samples=64",
                             "device=cuda:0", "output.path=one.h5"], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=1800)
    assert single.returncode == 0, single.stderr
    with h5py.File(tmp_path / "two" / "f.h5", "r") as a, h5py.File(tmp_path / "one.h5") as b:
        assert a["index"][:].tolist() == b["index"][:].tolist()
        for key in KEYS:
            np.testing.assert_allclose(a[key][:], b[key][:], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_devices() == 0, reason="needs a CUDA device")
def test_more_ranks_than_gpus_is_refused_in_one_line(tmp_path):
    ranks = _cuda_devices() + 1
    result = torchrun("dataset.num_samples=8", cwd=tmp_path, ranks=ranks)
    assert result.returncode == 1, result.stderr
    (line,) = probe_lines(result.stderr, "error")
    assert f"this node has {ranks - 1}, and this is local rank {ranks - 1}" in line
    assert f"--nproc-per-node={ranks - 1}" in line
