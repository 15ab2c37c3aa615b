"""probe on a real SLURM cluster, through hydra/launcher=submitit_slurm: the README's sweep and
sharded examples (with a tiny model), a job requeued by ``scontrol requeue`` and a job that
reaches its time limit and is requeued by submitit (max_num_timeout); each resumes after its
committed rows and ends equal to an uninterrupted run.

Needs a cluster whose jobs run on this machine and see its files, and PROBE_SLURM_TESTS=1:

    sudo bash tests/slurm/start_cluster.sh
    PROBE_SLURM_TESTS=1 .venv/bin/python -m pytest -m slow -n 0 tests/test_slurm.py

(about 6 minutes on 2 cores; `-n 0`: the tests share the cluster's two CPUs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import probe
from tests.conftest import REPO, TINY_NET, assert_same_datasets, compose_cfg

pytestmark = [
    pytest.mark.slow,
    pytest.mark.slurm,  # PROBE_SLURM_TESTS=1 selects them (tests/conftest.py)
    pytest.mark.skipif(os.environ.get("PROBE_SLURM_TESTS") != "1",
                       reason="needs a SLURM cluster and PROBE_SLURM_TESTS=1 "
                              "(sudo bash tests/slurm/start_cluster.sh)"),
]

# the README's launcher settings, for this machine's one partition and no GPU
LAUNCHER = ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug",
            "hydra.launcher.tasks_per_node=1", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10", "hydra.launcher.array_parallelism=2",
            "hydra.launcher.max_num_timeout=3"]
# batch_size=1: each sample is computed alone, so a resumed run's values match bit for bit
TINY = [*TINY_NET, "dataset.image_size=16", "batch_size=1", "output.commit_every=1"]
KEYS = ("index", "target", "fc/output")
# a run of known pace: SLURM can stop it part-way
PACED = ["dataset._target_=tests.tiny.PacedImages", "layers=[fc]"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    try:
        nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True,
                               timeout=30)
    except FileNotFoundError:
        pytest.fail("no sinfo here: start a cluster with sudo bash tests/slurm/start_cluster.sh")
    states = nodes.stdout.split()
    assert nodes.returncode == 0 and any(s in ("idle", "mix", "alloc") for s in states), (
        f"no SLURM node takes jobs ({nodes.stdout}{nodes.stderr}): "
        "sudo bash tests/slurm/start_cluster.sh")


def sweep(tmp_path: Path, *overrides: str, wait: bool = True, timeout: float = 600):
    """``python -m probe -m OVERRIDES`` with the SLURM launcher, from ``tmp_path``."""
    command = [sys.executable, "-m", "probe", "-m", *LAUNCHER, *TINY, *overrides]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
           "HYDRA_FULL_ERROR": "1", "TQDM_DISABLE": "1"}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    if not wait:
        return process
    return finish(process, timeout)


def finish(process: subprocess.Popen, timeout: float = 600) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        queue = subprocess.run(["squeue"], capture_output=True, text=True).stdout
        pytest.fail(f"the sweep did not end in {timeout} s; squeue:\n{queue}")
    assert process.returncode == 0, output
    return output


def jobs(tmp_path: Path) -> list[Path]:
    """The job folders of the sweep, each with the overrides it ran."""
    return sorted(p.parent.parent for p in (tmp_path / "outputs" / "multirun").glob(
        "*/.hydra/overrides.yaml"))


def reference(job: Path, directory: Path, *without: str) -> Path:
    """The job's run, uninterrupted, in this process (its overrides but those that start with
    one of ``without``: the pace of the samples, say, which does not change them)."""
    overrides = [o for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
                 if not o.startswith(without or ("\0",))]
    directory.mkdir(exist_ok=True)
    return probe.run(compose_cfg(*overrides, output=directory / f"{job.name}.h5", tiny=False))


def job_logs(tmp_path: Path) -> str:
    """What submitit's job logs say (outputs/multirun/.submitit/<job id>/*.out and .err)."""
    return "".join(p.read_text() for p in (tmp_path / "outputs" / "multirun" / ".submitit")
                   .rglob("*_log.*"))


def test_the_readme_sweep_runs_every_job_and_a_relaunch_skips_them(tmp_path):
    # the README's 2 models x 2 layer lists = 4 SLURM jobs (an array job), with two widths of a
    # tiny model for the two models
    args = ["+model.width=4,8", "layers=[features.0],[fc]", "dataset.num_samples=6"]
    output = sweep(tmp_path, *args)
    assert "Submitit 'slurm' sweep output dir" in output
    folders = jobs(tmp_path)
    assert len(folders) == 4, output
    for job in folders:
        keys = ("index", "target", "features.0/output" if "features.0" in job.name else "fc/output")
        assert_same_datasets(job / "features.h5", reference(job, tmp_path / "ref"), keys)
    again = sweep(tmp_path, *args)
    logs = [(job / "probe.log").read_text() for job in folders]
    assert sum("already complete for this config; nothing to do" in log for log in logs) == 4, again


def test_the_readme_sharded_run_merges_into_the_single_run(tmp_path):
    sweep(tmp_path, "layers=[fc]", "dataset.num_samples=9", "shard.count=2",
          "shard.index=range(2)")
    folders = jobs(tmp_path)
    assert len(folders) == 2 and all((job / "features.h5").is_file() for job in folders)
    # the sweep's merge callback joined the shards beside the job folders
    (merged,) = (tmp_path / "outputs" / "multirun").glob("*.h5")
    assert "shard.count-2" in merged.name and "shard.index" not in merged.name
    single = reference(folders[0], tmp_path / "ref", "shard.")
    assert_same_datasets(merged, single, KEYS)


def _job_id(name: str, seconds: float = 120) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        running = subprocess.run(["squeue", "-h", "-n", name, "-t", "R", "-o", "%i"],
                                 capture_output=True, text=True).stdout.split()
        if running:
            return running[0]
        time.sleep(0.5)
    pytest.fail(f"no job {name} ran within {seconds} s")


def _resumed_after(job: Path) -> list[int]:
    log = (job / "probe.log").read_text()
    return [int(n) for n in re.findall(r"resuming \S+ after (\d+) committed rows", log)]


def test_a_requeued_job_resumes_and_ends_equal(tmp_path):
    # 120 samples of 0.1 s: requeued (as an admin or a preemption would) after a few seconds
    process = sweep(tmp_path, *PACED, "dataset.num_samples=120", "+dataset.delay=0.1",
                    "hydra.launcher.name=probe-requeue", wait=False)
    job_id = _job_id("probe-requeue")
    deadline = time.monotonic() + 120
    while not list((tmp_path / "outputs" / "multirun").glob("*/features.h5.partial")):
        assert time.monotonic() < deadline, "the job never started writing"
        time.sleep(0.2)
    time.sleep(3)  # some rows committed
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    finish(process)
    (job,) = jobs(tmp_path)
    log = (job / "probe.log").read_text()
    assert "SIGTERM received: stopping after this batch" in log
    assert re.search(r"stopped by SIGTERM with \d+ of 120 rows saved", log), log
    resumed = _resumed_after(job)
    assert len(resumed) == 1 and 0 < resumed[0] < 120, log
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                           text=True).stdout
    assert "Restarts=1" in shown, shown
    assert_same_datasets(job / "features.h5", reference(job, tmp_path / "ref", "+dataset.delay"),
                         KEYS)


def test_a_job_at_its_time_limit_is_requeued_and_resumes(tmp_path):
    # Two minutes' limit, and submitit's signal 15 s before it. SLURM looks at time limits
    # every 30 s and sends the signal up to 30 s early, so it comes 75 to 105 s into the first
    # attempt, of which importing torch can take most of a minute on a loaded machine: 120 s
    # of samples take two to four attempts, with room for the imports.
    sweep(tmp_path, *PACED, "dataset.num_samples=600", "+dataset.delay=0.2",
          "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=15",
          "hydra.launcher.max_num_timeout=5", "hydra.launcher.name=probe-timeout",
          timeout=1500)
    (job,) = jobs(tmp_path)
    logs = (job / "probe.log").read_text()  # submitit's lines too
    requeued = re.findall(r"Requeued job \S+ \((\d) remaining timeouts\)", logs)
    assert "this job is timed-out" in logs and requeued, logs
    resumed = _resumed_after(job)
    # each attempt went on after the rows of the one before
    assert len(resumed) == len(requeued) and resumed == sorted(set(resumed)) and resumed[0] > 0, (
        logs)
    assert "DUE TO JOB REQUEUE" in job_logs(tmp_path)  # SLURM's own word, in the job's .err
    assert_same_datasets(job / "features.h5", reference(job, tmp_path / "ref", "+dataset.delay"),
                         KEYS)
    print(f"time limit: requeued {len(requeued)} times, resumed after {resumed} rows")

