"""Linear probes on a real run: well above chance, reproducible, and clear errors."""

from __future__ import annotations

import csv
import json
import shutil

import h5py
import pytest
import torch

import probe
from probe.analyses.fit import COLUMNS, fit_probes
from probe.analyses.plots import plot_accuracy
from probe.config.compose import compose
from probe.errors import ConfigError, DataError, OutputError
from tests.conftest import cli

LAYERS = ["layer1", "layer2", "layer3"]


# small matrices gain nothing from threads (tests/conftest.py one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """resnet18 (random weights) on 200 synthetic 32 px images, three layers mean-pooled."""
    path = tmp_path_factory.mktemp("fit") / "features.h5"
    cfg = compose(["model=resnet18", f"layers=[{','.join(LAYERS)}]",
                   "reduce=mean", "dataset.num_samples=200",
                   "dataset.image_size=32", "batch_size=50",
                   f"output.path={path}"])
    return probe.run(cfg)


def test_probes_beat_chance_widely_and_repeat_exactly(features):
    results = fit_probes(features, seed=0)
    assert [(r["layer"], r["kind"]) for r in results] == [(layer, "output") for layer in LAYERS]
    for r in results:
        assert set(r) == set(COLUMNS)
        assert (r["n_train"], r["n_test"]) == (150, 50)
        assert 0.1 <= r["chance"] < 0.3  # 10 classes: the commonest share of the 50 test rows
        assert r["accuracy"] >= r["chance"] + 0.4, r
    assert fit_probes(features, seed=0) == results  # same seed: the very same numbers
    # another seed draws another split (the accuracies are still far above chance)
    assert [r["accuracy"] > r["chance"] + 0.4 for r in fit_probes(features, seed=1)] == [True] * 3


def test_small_batches_and_folds(features):
    # 16-row mini-batches: many batches per epoch, each streamed from the file
    streamed = fit_probes(features, ["layer2/output"], batch_size=16, epochs=5)
    assert streamed[0]["accuracy"] >= streamed[0]["chance"] + 0.4
    folds = fit_probes(features, ["layer1"], folds=4, epochs=10)
    assert [(r["layer"], r["n_train"], r["n_test"]) for r in folds] == [("layer1", 150, 200)]
    assert folds[0]["accuracy"] >= folds[0]["chance"] + 0.4


def _variant(features, tmp_path, name, edit):
    path = tmp_path / name
    shutil.copy(features, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def test_user_errors_name_what_is_missing_and_the_fix(features, tmp_path):
    with pytest.raises(ConfigError, match=r"'hooks=\[forward,backward\]'") as err:
        fit_probes(features, ["layer2/grad_output"])
    assert "layer2/grad_output" in str(err.value) and "layers=[layer1,layer2,layer3]" in str(
        err.value)
    with pytest.raises(ConfigError, match="layer4/output"):
        fit_probes(features, ["layer4"])
    no_target = _variant(features, tmp_path, "no_target.h5", lambda f: f.__delitem__("target"))
    with pytest.raises(ConfigError, match="no 'target' dataset.*dataset=synthetic"):
        fit_probes(no_target)
    unfinished = _variant(features, tmp_path, "unfinished.h5",
                          lambda f: f.attrs.update({"complete": False, "num_committed": 120}))
    with pytest.raises(OutputError, match=r"\(120 of 200 rows\); run the same probe command"):
        fit_probes(unfinished)
    with pytest.raises(DataError, match="does not exist"):
        fit_probes(tmp_path / "nope.h5")
    with pytest.raises(ConfigError, match="test_fraction=1.5"):
        fit_probes(features, test_fraction=1.5)


def test_cli_writes_table_and_json(features, tmp_path):
    # that it never imports matplotlib without a plot: tests/test_fresh_imports.py
    result = cli(f"file={features}", f"out_dir={tmp_path}/fit", "epochs=10", "plot=false",
                 cwd=tmp_path, module="probe.fit")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert [line.split()[0] for line in lines[1:]] == LAYERS
    with (tmp_path / "fit" / "probes.csv").open() as stream:
        table = list(csv.DictReader(stream))
    rows = json.loads((tmp_path / "fit" / "probes.json").read_text())
    assert [r["layer"] for r in table] == [r["layer"] for r in rows] == LAYERS
    assert all(float(t["accuracy"]) == r["accuracy"] > r["chance"]
               for t, r in zip(table, rows, strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit"]  # no Hydra folders, no logs
    assert sorted(p.name for p in (tmp_path / "fit").iterdir()) == ["probes.csv", "probes.json"]


def test_adam_takes_the_steps_of_torch_optim_adam():
    from probe.analyses.fit import Adam

    start = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    ours, theirs = start.clone().requires_grad_(True), start.clone().requires_grad_(True)
    mine = Adam([ours], lr=0.01, weight_decay=1e-4)
    reference = torch.optim.Adam([theirs], lr=0.01, weight_decay=1e-4)
    for step in range(20):
        x = torch.randn(8, 5, generator=torch.Generator().manual_seed(step))
        mine.step(torch.autograd.grad((x @ ours).square().mean(), [ours]))
        reference.zero_grad()
        (x @ theirs).square().mean().backward()
        reference.step()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert (ours - start).abs().min() > 0.05  # 20 steps of 0.01 moved every weight


def test_accuracy_plot_is_a_png(features, tmp_path):
    results = fit_probes(features, epochs=5)
    png = plot_accuracy(results, tmp_path / "plots" / "accuracy.png", title="resnet18")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_cli_bad_input_is_one_line_and_exit_1(features, tmp_path):
    result = cli(f"file={features}", "keys=[layer3/grad_output]", cwd=tmp_path,
                 module="probe.fit")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("probe: error:")]
    assert len(errors) == 1 and "hooks=[forward,backward]" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []
