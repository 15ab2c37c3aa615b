"""Runs that are killed, interrupted or stopped resume from what they committed, and the
finished file equals the one an uninterrupted run writes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

import probe
from probe.errors import OutputError, RunStopped
from probe.pipeline.execute import StopRequest
from tests.conftest import (
    REPO,
    TINY_NET,
    PacedImages,
    assert_same_datasets,
    compose_cfg,
    interrupt_after,
    no_h5_files,
    run_with,
)

# A tiny model over images that take 10 ms each to load: a run of a few hundred samples lasts
# long enough to be killed part-way, whatever the machine's speed
RUN = [*TINY_NET, "layers=[features.0,fc]", "dataset._target_=tests.tiny.PacedImages",
       "+dataset.delay=0.01", "dataset.image_size=32", "batch_size=4", "output.commit_every=1",
       "num_workers=0"]
KEYS = ("index", "target", "features.0/output", "fc/output")


def _start(tmp_path, samples: int, out: str, *extra: str, env: dict | None = None):
    args = [*RUN, f"dataset.num_samples={samples}", f"output.path={tmp_path / out}", *extra]
    # a session of its own, so that a signal can go to its whole process group, as SLURM's does
    return subprocess.Popen([sys.executable, "-m", "probe", *args], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _assert_same_file(a, b) -> None:
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        assert x.attrs["complete"] and y.attrs["complete"]
    assert_same_datasets(a, b, KEYS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, by sample count (in this process: the values do not depend on it)."""
    directory = tmp_path_factory.mktemp("reference")
    done = {}

    def get(samples: int):
        if samples not in done:
            done[samples] = probe.run(compose_cfg(*RUN, f"dataset.num_samples={samples}",
                                                  output=directory / f"{samples}.h5", tiny=False))
        return done[samples]

    return get


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_at_a_batch_boundary_and_the_run_resumes(tmp_path, reference, signum):
    samples, out = 40, tmp_path / "f.h5"
    cfg = compose_cfg(*RUN, f"dataset.num_samples={samples}", output=out, tiny=False)
    # the signal comes while the run loads sample 9, in its third batch of 4
    data = PacedImages(samples, 32, at=9, signum=signum)
    with pytest.raises(RunStopped, match="with 12 of 40 rows saved.*run the same command "
                                         "again to resume") as stopped:
        run_with(cfg, dataset=data)
    assert stopped.value.exit_code == 128 + signum
    assert signal.getsignal(signum) is not None  # the run's handler is gone again
    with probe.open(out, allow_partial=True) as partial:
        assert partial.num_rows == 12 and not partial.complete
    probe.run(cfg)
    _assert_same_file(out, reference(samples))


def test_the_signal_handler_logs_nothing(tmp_path, reference):
    """Logging from a signal handler can interrupt another write to the same log file (on a
    requeue, submitit's handler was writing to it), which the buffered writer refuses
    ("reentrant call"): the run says that it stops from its loop instead."""
    import logging

    in_handler: list[tuple[str, bool]] = []

    class Watch(logging.Handler):
        def emit(self, record):
            frame, inside = sys._getframe(), False
            while frame is not None:
                inside |= (frame.f_code.co_name == "handler"
                           and frame.f_code.co_filename.endswith("execute.py"))
                frame = frame.f_back
            in_handler.append((record.getMessage(), inside))

    watch = Watch(level=logging.DEBUG)
    logging.getLogger().addHandler(watch)
    try:
        cfg = compose_cfg(*RUN, "dataset.num_samples=40", output=tmp_path / "f.h5", tiny=False)
        with pytest.raises(RunStopped):
            run_with(cfg, dataset=PacedImages(40, 32, at=9, signum=signal.SIGTERM))
    finally:
        logging.getLogger().removeHandler(watch)
    assert ("SIGTERM received: stopping after this batch", False) in in_handler
    assert not [message for message, inside in in_handler if inside]


def test_a_schedulers_sigusr2_handler_gets_the_signal_after_the_commit(tmp_path, reference,
                                                                       caplog):
    # submitit waits for SIGUSR2 before a preemption or the time limit, and requeues the job
    samples, out = 40, tmp_path / "f.h5"
    cfg = compose_cfg(*RUN, f"dataset.num_samples={samples}", output=out, tiny=False)
    handed = []

    def requeue(signum, frame):  # as submitit's handler: it would requeue, then exit
        with probe.open(out, allow_partial=True) as partial:
            handed.append((signum, partial.num_rows))

    previous = signal.signal(signal.SIGUSR2, requeue)
    try:
        with pytest.raises(RunStopped, match="stopped by SIGUSR2 with 12 of 40 rows saved"):
            run_with(cfg, dataset=PacedImages(samples, 32, at=9, signum=signal.SIGUSR2))
        assert signal.getsignal(signal.SIGUSR2) is requeue
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert handed == [(signal.SIGUSR2, 12)]  # after the rows were committed
    assert "stopped by SIGUSR2 with 12 of 40 rows saved" in caplog.text  # in the job's log
    probe.run(cfg)
    _assert_same_file(out, reference(samples))


def test_a_job_out_of_requeues_says_that_relaunching_resumes(tmp_path, caplog):
    samples, out = 40, tmp_path / "f.h5"
    cfg = compose_cfg(*RUN, f"dataset.num_samples={samples}", output=out, tiny=False)

    def out_of_time(signum, frame):  # as submitit's handler, when max_num_timeout is spent
        raise RuntimeError("Job not requeued because: timed-out too many times.")

    previous = signal.signal(signal.SIGUSR2, out_of_time)
    try:
        with pytest.raises(RuntimeError, match="timed-out too many times"):
            run_with(cfg, dataset=PacedImages(samples, 32, at=9, signum=signal.SIGUSR2))
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert ("the job was not requeued (Job not requeued because: timed-out too many times.); "
            "launch the same command again to resume after the 12 rows saved") in caplog.text


@pytest.mark.process
def test_sigterm_to_the_process_group_with_loader_workers(tmp_path):
    """SLURM signals every process of a job: the DataLoader's workers must leave the stop to
    the run, or the loader fails before the run can commit and say how to resume."""
    process = _start(tmp_path, 200, "f.h5", "num_workers=2", "+dataset.at=40",
                     "+dataset.group=true")
    _, stderr = process.communicate(timeout=1800)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    # a stop the user asked for is reported as a stop, in one line, not as an error
    lines = [line for line in stderr.splitlines()
             if line.startswith(("probe: error", "probe: stopped"))]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("probe: stopped by SIGTERM with ") and lines[0].endswith(
        f"rows saved in {tmp_path}/f.h5.partial; run the same command again to resume")


def test_a_stop_before_the_first_commit_leaves_nothing_and_says_so(make_cfg, tmp_path):
    # compressed rows wait for their chunk (4 rows here), so the first batch of 2 is not saved
    cfg = make_cfg("model=resnet18", "layers=[fc]", "batch_size=2", "output.compression=lzf")
    with pytest.raises(RunStopped, match="before any rows were saved") as info:
        probe.execute(probe.plan(cfg), stop=StopRequest(signal.SIGINT))
    assert info.value.exit_code == 130 and no_h5_files(tmp_path)


def _kill_until_done(tmp_path, samples: int, kills: int, seed: int, *extra: str,
                     at: int | None = None) -> list[int]:
    """SIGKILL the run ``kills`` times, then let it finish; the rows each attempt found
    committed. The kill comes when the dataset loads sample ``at``, or, without ``at``, at a
    random moment after the process starts (before its file exists, sometimes, or in its
    first commit)."""
    rng = random.Random(seed)
    resumed_at = []
    for attempt in range(kills + 1):
        killing = attempt < kills
        env = ({"PACED_SIGNAL_AT": str(at), "PACED_SIGNAL": str(int(signal.SIGKILL))}
               if killing and at is not None else {})
        process = _start(tmp_path, samples, "f.h5", *extra, env=env)
        if killing and at is None:
            time.sleep(rng.uniform(0.0, 6.0))  # python and torch take about 3 s to start
            process.kill()
        stdout, stderr = process.communicate(timeout=1800)
        lines = (stdout + stderr).splitlines()
        marker = [line for line in lines if "resuming" in line]
        if marker:
            resumed_at.append(int(marker[0].split("after ")[1].split()[0]))
        elif any("layers x" in line for line in lines):  # it planned, and found no rows
            resumed_at.append(0)  # (a kill before the plan tells nothing of what was kept)
        if not killing or _finished_first(process, tmp_path / "f.h5"):
            assert process.returncode in (0, -signal.SIGKILL), stderr
            break
        assert process.returncode == -signal.SIGKILL, stderr
        assert not (tmp_path / "f.h5").exists()  # a partial file never sits at the path
        if (tmp_path / "f.h5.partial").exists():
            with pytest.raises(OutputError, match="not finished"):
                probe.open(tmp_path / "f.h5")
    return resumed_at


def _finished_first(process: subprocess.Popen, path: Path) -> bool:
    """Whether a run that was to be killed at a random moment finished before it (the rows
    left after a few kills take less time than the wait): then its file is complete."""
    if process.returncode != 0 and not path.exists():
        return False
    with probe.open(path) as f:  # refuses a file that is not complete
        assert f.complete
    return True


# compressed chunks are written whole, so they take another path through the store
COMPRESSION = ["output.compression=none", "output.compression=lzf"]


# the default suite kills runs at known writes instead (test_kill_anywhere)
@pytest.mark.slow
@pytest.mark.parametrize("compression", COMPRESSION)
def test_sigkill_then_resume_gives_the_uninterrupted_file(tmp_path, reference, compression):
    resumed_at = _kill_until_done(tmp_path, 300, 1, 0, compression, at=150)
    assert max(resumed_at) > 0  # work was kept, not redone
    _assert_same_file(tmp_path / "f.h5", reference(300))


@pytest.mark.slow
@pytest.mark.parametrize("compression", COMPRESSION)
def test_many_random_sigkills(tmp_path, reference, compression):
    resumed_at = _kill_until_done(tmp_path, 600, 25, 1, compression)
    assert resumed_at == sorted(resumed_at)  # committed rows never go backwards
    _assert_same_file(tmp_path / "f.h5", reference(600))


def test_resume_with_another_config_is_refused(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg("model=resnet18", "layers=[fc]", "batch_size=2", "output.commit_every=1")
    interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    with pytest.raises(OutputError, match=r"differs in: layers, reduce"):
        probe.run(make_cfg("model=resnet18", "layers=[layer4]", "reduce=mean"))
    # settings that do not shape the values may change between attempts
    probe.run(make_cfg("model=resnet18", "layers=[fc]", "batch_size=3", "num_workers=1"))
    with probe.open(tmp_path / "features.h5") as f:
        assert f.index.tolist() == list(range(6))


def test_a_run_that_cannot_fit_fails_at_once(make_cfg, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(OutputError, match=r"needs about .* GiB .* GiB free"):
        probe.run(make_cfg("model=resnet18", "layers=[layer1]"))
    assert no_h5_files(tmp_path)
    probe.run(make_cfg("model=resnet18", "layers=[layer1]", "output.check_free_space=false"))
