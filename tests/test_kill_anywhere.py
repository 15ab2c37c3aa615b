"""A kill at any write, or a full disk at any write, never costs more than the rows since the
last commit: the rerun finishes with a file equal to an uninterrupted run's, value for value.

tests/crash/killwrite.c, preloaded into a driver process (tests/crash/driver.py), stops a run
just before its k-th write to its output files (or makes that write and all later ones fail
with ENOSPC); the driver forks one run per k and reruns it without the shim. The default suite
tries a few writes spread over each kind of run; ``-m slow`` tries every write of image runs
and a hundred and twenty of text runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import probe
from tests.conftest import REPO, TINY_NET, cli, error_line, run_cli

# every test here drives runs in processes of their own, killed at their writes
pytestmark = pytest.mark.process

CRASH = REPO / "tests" / "crash"
IMAGES = [*TINY_NET, "layers=[features.0,fc]", "dataset.image_size=32",
          "dataset.num_samples=40", "batch_size=4", "output.commit_every=1"]
IMAGE_KEYS = ["index", "target", "features.0/output", "fc/output"]
# a folder of pictures: the run stores each row's file name, a variable-length string
FOLDER = [*TINY_NET, "layers=[features.0,fc]", "dataset=imagefolder", "dataset.image_size=32",
          "batch_size=4", "output.commit_every=1"]
FOLDER_KEYS = [*IMAGE_KEYS, "file"]
GRADIENTS = ["hooks=[forward,backward]", "objective=nll"]
TEXT_KEYS = ["index", "offsets", "input_ids", "positions", "transformer.h.0/output",
             "transformer.h.1/grad_output"]


@pytest.fixture(scope="session")
def shim(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build tests/crash/killwrite.c")
    built = tmp_path_factory.mktemp("shim") / "killwrite.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built),
                    str(CRASH / "killwrite.c"), "-ldl"], check=True)
    return built


def _drive(shim, root, specs: list[dict]) -> list[dict]:
    """Run the driver on ``specs`` (one process for all of them); each spec's result."""
    root.mkdir(parents=True, exist_ok=True)
    spec_file = root / "specs.json"
    spec_file.write_text(json.dumps(specs))
    env = {**os.environ, "LD_PRELOAD": str(shim), "KILL_MATCH": "features.h5.partial",
           "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, str(CRASH / "driver.py"), str(root / "runs"),
                           str(spec_file)], env=env, capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spec(overrides, keys, points=None, mode="kill") -> dict:
    return {"overrides": overrides, "keys": keys, "points": points, "mode": mode}


def _check(result: dict, points=None) -> dict:
    assert result["tried"] >= min(result["writes"], points or result["writes"]), result
    assert result["failed"] == [], json.dumps(result["failed"][:3], indent=1)
    return result


def _kill_everywhere(shim, tmp_path, overrides, keys, points=None, mode="kill"):
    """Kill (or fill the disk of) the run at ``points`` of its writes, spread evenly (None:
    at every write), rerun each time, and compare with an uninterrupted run."""
    (result,) = _drive(shim, tmp_path, [_spec(overrides, keys, points, mode)])
    return _check(result, points)


def _corpus(directory):
    from tests.tiny_text import documents, write_jsonl

    return write_jsonl(directory / "docs.jsonl", documents(24, seed=1, high=20))


def _text_run(tiny_lm, corpus) -> list[str]:
    return ["model=transformers", f"model.name={tiny_lm}", "dataset=text",
            f"dataset.path={corpus}", "layers=[transformer.h.0,transformer.h.1]",
            "batch_size=4", "output.commit_every=1"]


@pytest.fixture
def text_run(tiny_lm, tmp_path):
    return _text_run(tiny_lm, _corpus(tmp_path))


def _folder(directory) -> str:
    from tests.tiny_vision import pictures

    pictures(directory, sizes=[(40, 30), (64, 80), (33, 33)] * 8)
    return f"dataset.root={directory}"


def test_images_survive_a_kill_or_a_full_disk_at_any_write(shim, tmp_path):
    # one driver process for them all (one import of torch); the folder run's points include
    # kills between a batch's strings and their heap, which once broke every rerun
    root = _folder(tmp_path / "pictures")
    none, gzip, full, folder = _drive(shim, tmp_path, [
        _spec([*IMAGES, "output.compression=none"], IMAGE_KEYS, 8),
        _spec([*IMAGES, "output.compression=gzip"], IMAGE_KEYS, 8),
        _spec(IMAGES, IMAGE_KEYS, 5, mode="enospc"),
        _spec([*FOLDER, root], FOLDER_KEYS, 12)])
    for result, points in ((none, 8), (gzip, 8), (full, 5), (folder, 12)):
        _check(result, points)
    # creation, every commit, the finish and the rename: a run of 10 batches writes often
    assert none["writes"] > 40 and gzip["writes"] > 40


def test_text_gradients_survive_a_kill_at_any_write(shim, tmp_path, text_run):
    pytest.importorskip("transformers")
    _kill_everywhere(shim, tmp_path, [*text_run, *GRADIENTS, "output.compression=gzip"],
                     TEXT_KEYS, points=6)


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
@pytest.mark.parametrize("mode", ["kill", "enospc"])
def test_images_survive_a_kill_at_every_write(shim, tmp_path, compression, mode):
    _kill_everywhere(shim, tmp_path, [*IMAGES, f"output.compression={compression}"],
                     IMAGE_KEYS, mode=mode)


@pytest.mark.slow
def test_a_folder_of_pictures_survives_a_kill_at_every_write(shim, tmp_path):
    _kill_everywhere(shim, tmp_path, [*FOLDER, _folder(tmp_path / "pictures")], FOLDER_KEYS)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[*GRADIENTS, "output.compression=none"],
                                   [*GRADIENTS, "output.compression=gzip"],
                                   ["dataset.streaming=true"]])
def test_text_survives_a_kill_at_many_writes(shim, tmp_path, text_run, extra):
    pytest.importorskip("transformers")
    keys = TEXT_KEYS if GRADIENTS[0] in extra else TEXT_KEYS[:-1]
    _kill_everywhere(shim, tmp_path, [*text_run, *extra], keys, points=120)


def test_a_full_disk_is_one_line_and_the_rerun_continues(shim, tmp_path):
    # the 40th write to the partial file fails with ENOSPC, and so does every later one
    out = tmp_path / "features.h5"
    args = [*IMAGES, f"output.path={out}"]
    full = run_cli(*args, cwd=tmp_path, LD_PRELOAD=str(shim), KILL_MATCH="features.h5.partial",
                   KILL_AT="40", KILL_MODE="enospc")
    line = error_line(full)
    assert re.search(r"the disk that holds .* is full \(.* free\) after writing .*: (\d+) of 40 "
                     r"rows are saved in features.h5.partial; free space, then run the same "
                     r"command again to continue", line), line
    saved = int(re.search(r": (\d+) of 40", line).group(1))
    assert saved > 0 and not out.exists()
    again = cli(*args, cwd=tmp_path)  # space again
    assert again.returncode == 0, again.stderr
    assert f"resuming {out}.partial after {saved} committed rows" in again.stdout + again.stderr
    with probe.open(out) as f:
        assert f.index.tolist() == list(range(40))
