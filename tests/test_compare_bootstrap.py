"""Bootstrap intervals of CKA: equal to CKA computed by numpy on the drawn rows themselves
(the same seeded draws as RSA's bootstrap, copies included), in one batch of draws or several,
biased and debiased, within one file and between two; and the refusal when the Grams do not
fit."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from probe.analyses.compare import compare
from probe.errors import ConfigError
from tests.conftest import cli
from tests.test_compare import cka_debiased_reference, cka_reference, write_probe_file

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = 40


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("boot")
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(ROWS, 3))
    layers = []
    for _ in range(2):
        layers.append({f"l{j}/output": (np.tanh(latent @ rng.normal(size=(3, w)))
                                        + 0.7 * rng.normal(size=(ROWS, w)) + 2.0)
                       .astype(np.float32) for j, w in enumerate((6, 50))})
    paths = [write_probe_file(folder / f"{i}.h5", np.arange(ROWS), x)
             for i, x in enumerate(layers)]
    return paths, [{k: v.astype(np.float64) for k, v in x.items()} for x in layers]


def _reference(x, y, samples, seed, debiased):
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(samples):
        chosen = np.sort(rng.integers(0, len(x), len(x)))
        reference = cka_debiased_reference if debiased else cka_reference
        values.append(reference(x[chosen], y[chosen]))
    return np.percentile(values, [2.5, 97.5])


@pytest.mark.parametrize("metric", ["cka", "cka_debiased"])
def test_intervals_equal_numpy_on_the_drawn_rows(files, metric):
    paths, layers = files
    # 64 MiB: every draw in one batch; 0.2 MiB: batches of about 30 draws
    results = [compare(*paths, metric=metric, bootstrap=50, seed=3, memory_mb=memory_mb)
               for memory_mb in (64, 0.2)]
    assert results[0].intervals.keys() == results[1].intervals.keys()
    for pair, interval in results[0].intervals.items():
        assert interval == pytest.approx(results[1].intervals[pair], abs=1e-13)
    for (a, b), (low, high) in results[0].intervals.items():
        expected = _reference(layers[0][a], layers[1][b], 50, 3, metric == "cka_debiased")
        assert (low, high) == pytest.approx(tuple(expected), abs=1e-12), (a, b)
        assert low < high
    assert compare(*paths, metric=metric, bootstrap=50, seed=4).intervals != results[0].intervals


def test_within_one_file_every_ordered_pair_has_its_interval(files):
    paths, layers = files
    result = compare(paths[0], metric="cka", bootstrap=20, seed=1)
    assert set(result.intervals) == {(a, b) for a in layers[0] for b in layers[0]}
    assert result.intervals[("l0/output", "l1/output")] == result.intervals[
        ("l1/output", "l0/output")]
    expected = _reference(layers[0]["l0/output"], layers[0]["l1/output"], 20, 1, False)
    assert result.intervals[("l0/output", "l1/output")] == pytest.approx(tuple(expected),
                                                                         abs=1e-12)
    low, high = result.intervals[("l0/output", "l0/output")]
    assert low == pytest.approx(1.0, abs=1e-12) and high == pytest.approx(1.0, abs=1e-12)


def test_grams_larger_than_the_budget_are_refused_in_one_line(files):
    paths, _ = files
    with pytest.raises(ConfigError, match="Gram matrices of 40 rows") as raised:
        compare(*paths, metric="cka", bootstrap=5, memory_mb=0.05)
    assert "\n" not in str(raised.value)
    # and the memory_mb it names is enough
    enough = float(re.search(r"memory_mb=([0-9.e+-]+) or more", str(raised.value)).group(1))
    assert compare(*paths, metric="cka", bootstrap=5, memory_mb=enough * 1.01).intervals


def test_the_command_writes_the_interval_columns(files, tmp_path):
    paths, _ = files
    out = tmp_path / "out"
    result = cli(f"file={paths[0]}", f"other={paths[1]}", "bootstrap=10", f"out_dir={out}",
                 "plot=false", cwd=tmp_path, module="probe.compare")
    assert result.returncode == 0, result.stderr
    assert "10 bootstrap samples of the 40 rows" in result.stderr
    with (out / "similarity.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["key_a", "key_b", "metric", "value", "ci_low", "ci_high"]
    assert all(float(r["ci_low"]) <= float(r["ci_high"]) for r in rows)
