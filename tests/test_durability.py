"""Runs that are killed, interrupted or stopped resume from what they committed, and the
finished file equals the one an uninterrupted run writes."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time

import h5py
import pytest
from hydra import compose, initialize_config_dir

import probe
import probe.runner
import probe.writer
from probe.config import CONFIG_DIR
from probe.errors import OutputError, RunStopped
from tests.conftest import assert_same_datasets, no_h5_files

# resnet18 at 32 px on 2 CPU cores: a few hundred samples take several seconds, long enough
# to be interrupted part-way
RUN = ["model=resnet18", "layers=[layer3,fc]", "dataset.image_size=32", "batch_size=4",
       "output.commit_every=1", "num_workers=0"]


def _start(tmp_path, samples: int, out: str, *extra: str):
    args = [*RUN, f"dataset.num_samples={samples}", f"output.path={tmp_path / out}", *extra]
    # a session of its own, so that a signal can go to its whole process group, as SLURM's does
    return subprocess.Popen([sys.executable, "-m", "probe", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _assert_same_file(a, b) -> None:
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        assert x.attrs["complete"] and y.attrs["complete"]
    assert_same_datasets(a, b, ("index", "target", "layer3/output", "fc/output"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs, by sample count (in this process: the values do not depend on it)."""
    directory = tmp_path_factory.mktemp("reference")
    done = {}

    def get(samples: int):
        if samples not in done:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
                cfg = compose("config", [*RUN, f"dataset.num_samples={samples}",
                                         f"output.path={directory}/{samples}.h5"])
            done[samples] = probe.run(cfg)
        return done[samples]

    return get


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_at_a_batch_boundary_and_the_run_resumes(tmp_path, reference, signum):
    samples = 800
    process = _start(tmp_path, samples, "f.h5")
    _wait_for(tmp_path / "f.h5.partial")
    time.sleep(0.5)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("probe: error:")]
    assert len(lines) == 1 and "run the same command again to resume" in lines[0], stderr
    with probe.open(tmp_path / "f.h5", allow_partial=True) as partial:
        saved = partial.num_rows
    assert 0 < saved < samples

    process = _start(tmp_path, samples, "f.h5")
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert f"after {saved} committed rows" in stdout + stderr
    _assert_same_file(tmp_path / "f.h5", reference(samples))


def test_sigterm_to_the_process_group_with_loader_workers(tmp_path):
    """SLURM signals every process of a job: the DataLoader's workers must leave the stop to
    the run, or the loader fails before the run can commit and say how to resume."""
    process = _start(tmp_path, 3000, "f.h5", "num_workers=2")
    _wait_for(tmp_path / "f.h5.partial")
    time.sleep(1.0)
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr


def test_a_stop_before_the_first_commit_leaves_nothing_and_says_so(make_cfg, tmp_path,
                                                                   monkeypatch):
    @contextlib.contextmanager
    def sigint_at_once():
        yield [signal.SIGINT]  # as if Ctrl-C came during the first batch

    monkeypatch.setattr(probe.runner, "_stop_signals", sigint_at_once)
    # compressed rows wait for their chunk (4 rows here), so the first batch of 2 is not saved
    cfg = make_cfg("model=resnet18", "layers=[fc]", "batch_size=2", "output.compression=lzf")
    with pytest.raises(RunStopped, match="before any rows were saved") as info:
        probe.run(cfg)
    assert info.value.exit_code == 130 and no_h5_files(tmp_path)


def _kill_until_done(tmp_path, samples: int, kills: int, seed: int, *extra: str) -> list[int]:
    """SIGKILL the run at random moments ``kills`` times, then let it finish; the rows each
    attempt found committed."""
    rng = random.Random(seed)
    resumed_at = []
    for attempt in range(kills + 1):
        process = _start(tmp_path, samples, "f.h5", *extra)
        if attempt < kills:
            _wait_for(tmp_path / "f.h5.partial")
            time.sleep(rng.uniform(0.0, 1.5))
            process.kill()
        stdout, stderr = process.communicate(timeout=300)
        marker = [line for line in (stdout + stderr).splitlines() if "resuming" in line]
        resumed_at.append(int(marker[0].split("after ")[1].split()[0]) if marker else 0)
        if attempt == kills:
            assert process.returncode == 0, stderr
    return resumed_at


# compressed chunks are written whole, so they take another path through the store
COMPRESSION = ["output.compression=none", "output.compression=lzf"]


@pytest.mark.parametrize("compression", COMPRESSION)
def test_sigkill_then_resume_gives_the_uninterrupted_file(tmp_path, reference, compression):
    resumed_at = _kill_until_done(tmp_path, 800, 2, 0, compression)
    assert max(resumed_at) > 0  # work was kept, not redone
    _assert_same_file(tmp_path / "f.h5", reference(800))


@pytest.mark.slow
@pytest.mark.parametrize("compression", COMPRESSION)
def test_many_random_sigkills(tmp_path, reference, compression):
    resumed_at = _kill_until_done(tmp_path, 1200, 25, 1, compression)
    assert resumed_at == sorted(resumed_at)  # committed rows never go backwards
    _assert_same_file(tmp_path / "f.h5", reference(1200))


def test_resume_with_another_config_is_refused(make_cfg, tmp_path, monkeypatch):
    cfg = make_cfg("model=resnet18", "layers=[fc]", "batch_size=2", "output.commit_every=1")
    calls = []
    original = probe.writer.BackgroundWriter.put

    def put_then_stop(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        original(self, *args, **kwargs)

    monkeypatch.setattr(probe.writer.BackgroundWriter, "put", put_then_stop)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    monkeypatch.undo()
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


def test_partial_file_never_sits_at_the_output_path(tmp_path):
    process = _start(tmp_path, 400, "f.h5")
    _wait_for(tmp_path / "f.h5.partial")
    assert not (tmp_path / "f.h5").exists()
    os.kill(process.pid, signal.SIGKILL)
    process.communicate()
    assert not (tmp_path / "f.h5").exists()
    with pytest.raises(OutputError, match="not finished"):
        probe.open(tmp_path / "f.h5")
