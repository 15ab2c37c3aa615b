"""RSA against a brain: rdm= and responses= (one RDM or one per subject), their stimuli matched
by index=, the noise ceiling and bootstrap intervals, checked against rsatoolbox and against
numpy + scipy on the same bootstrap draws."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest
import scipy.stats

import probe
from probe.analyses.compare import compare
from probe.errors import ConfigError, DataError
from tests.conftest import TINY_NET, cli, compose_cfg

rsatoolbox = pytest.importorskip("rsatoolbox")

LAYERS = ["features.1", "pool", "fc"]
KEYS = [f"{layer}/output" for layer in LAYERS]
SAMPLES = 40
SUBJECTS = 4


def _run(path, *overrides):
    cfg = compose_cfg(*TINY_NET, f"layers=[{','.join(LAYERS)}]", f"dataset.num_samples={SAMPLES}",
                      "dataset.image_size=16", "batch_size=16", *overrides, output=path,
                      tiny=False)
    return probe.run(cfg)


def _rows(path, key):
    with h5py.File(path, "r") as f:
        return f[key][:].reshape(len(f[key]), -1).astype(np.float64), f["index"][:]


@pytest.fixture(scope="module")
def brain(tmp_path_factory):
    """A file of TinyNet on 40 images, a random 24 of them in another run, and a synthetic
    brain of 4 subjects whose responses are a noisy linear map of the pool layer."""
    folder = tmp_path_factory.mktemp("brain")
    path = _run(folder / "a.h5")
    subset = _run(folder / "subset.h5", "limit=24", "subset=random")
    x, index = _rows(path, "pool/output")
    assert (index == np.arange(SAMPLES)).all()
    rng = np.random.default_rng(1)
    weights = rng.normal(size=(x.shape[1], 60))
    signal = x @ weights
    responses = np.stack([signal + 0.5 * signal.std() * rng.normal(size=signal.shape)
                          for _ in range(SUBJECTS)])
    np.save(folder / "responses.npy", responses)
    matrices = np.stack([1 - np.corrcoef(r) for r in responses])
    for m in matrices:
        np.fill_diagonal(m, 0.0)
    np.save(folder / "subjects.npy", matrices)
    np.save(folder / "one.npy", matrices[0])
    return {"file": path, "subset": subset, "folder": folder, "responses": responses,
            "matrices": matrices}


def _toolbox_rdms(matrices):
    return rsatoolbox.rdm.RDMs(np.asarray(matrices), dissimilarity_measure="correlation")


def _model_rdm(x):
    data = rsatoolbox.data.Dataset(x)
    return rsatoolbox.rdm.calc_rdm(data, method="correlation")


# --- the values, against rsatoolbox ---------------------------------------------------------

def test_one_rdm_equals_rsatoolbox(brain):
    result = compare(brain["file"], rdm=str(brain["folder"] / "one.npy"))
    assert result.metric == "rsa" and result.keys_b == ["rdm:one.npy"]
    assert result.ceiling is None and result.intervals == {}
    for key in KEYS:
        x, _ = _rows(brain["file"], key)
        expected = rsatoolbox.rdm.compare(_model_rdm(x), _toolbox_rdms(brain["matrices"][:1]),
                                          method="spearman")[0, 0]
        assert result.values[(key, "rdm:one.npy")] == pytest.approx(expected, abs=1e-12)


def test_subjects_give_the_mean_over_subjects_and_rsatoolbox_noise_ceiling(brain):
    result = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"))
    subjects = _toolbox_rdms(brain["matrices"])
    for key in KEYS:
        x, _ = _rows(brain["file"], key)
        per_subject = rsatoolbox.rdm.compare(_model_rdm(x), subjects, method="spearman")
        assert result.values[(key, "rdm:subjects.npy")] == pytest.approx(
            per_subject.mean(), abs=1e-12)
    lower, upper = rsatoolbox.inference.boot_noise_ceiling(subjects, method="spearman")
    assert result.ceiling == pytest.approx((lower, upper), abs=1e-12)
    assert lower < upper
    # the brain is a noisy map of the pool layer: that layer wins, below the upper bound
    best = max(KEYS, key=lambda k: result.values[(k, "rdm:subjects.npy")])
    assert best == "pool/output"
    assert result.values[("pool/output", "rdm:subjects.npy")] <= upper


def test_every_form_of_the_rdms_gives_the_same_values(brain, tmp_path):
    matrices = brain["matrices"]
    rows, cols = np.triu_indices(SAMPLES, 1)
    np.save(tmp_path / "condensed.npy", matrices[:, rows, cols])
    np.save(tmp_path / "condensed_one.npy", matrices[0, rows, cols])
    with h5py.File(tmp_path / "brain.h5", "w") as f:
        f["roi/v1"] = matrices
    reference = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"))
    expected = [reference.values[(k, "rdm:subjects.npy")] for k in KEYS]
    for spec, name in [(tmp_path / "condensed.npy", "rdm:condensed.npy"),
                       (f"{tmp_path / 'brain.h5'}:roi/v1", "rdm:brain.h5:roi/v1")]:
        result = compare(brain["file"], rdm=str(spec))
        assert [result.values[(k, name)] for k in KEYS] == pytest.approx(expected, abs=1e-12)
    single = compare(brain["file"], rdm=str(tmp_path / "condensed_one.npy"))
    one = compare(brain["file"], rdm=str(brain["folder"] / "one.npy"))
    assert [single.values[(k, "rdm:condensed_one.npy")] for k in KEYS] == pytest.approx(
        [one.values[(k, "rdm:one.npy")] for k in KEYS], abs=1e-12)
    # responses: their RDMs are rsatoolbox's correlation RDMs of each subject
    made = compare(brain["file"], responses=str(brain["folder"] / "responses.npy"))
    toolbox = [rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(r), method="correlation")
               for r in brain["responses"]]
    subjects = _toolbox_rdms(np.concatenate([t.get_matrices() for t in toolbox]))
    for key in KEYS:
        x, _ = _rows(brain["file"], key)
        expected = rsatoolbox.rdm.compare(_model_rdm(x), subjects, method="spearman").mean()
        assert made.values[(key, "responses:responses.npy")] == pytest.approx(expected,
                                                                              abs=1e-12)


def test_index_matches_the_stimuli_to_the_rows_of_another_order_and_subset(brain, tmp_path):
    # the brain's stimuli in a shuffled order, the file a random 24 of the 40 samples
    order = np.random.default_rng(3).permutation(SAMPLES)
    shuffled = brain["matrices"][:, order][:, :, order]
    np.save(tmp_path / "shuffled.npy", shuffled)
    np.save(tmp_path / "index.npy", order)
    result = compare(brain["subset"], rdm=str(tmp_path / "shuffled.npy"),
                     index=str(tmp_path / "index.npy"))
    x, index = _rows(brain["subset"], "fc/output")
    assert len(index) == 24 and result.rows == 24
    target = brain["matrices"][:, index][:, :, index]  # stimulus = dataset sample
    above = np.triu_indices(24, 1)
    expected = np.mean([scipy.stats.spearmanr((1 - np.corrcoef(x))[above], t[above]).statistic
                        for t in target])
    assert result.values[("fc/output", "rdm:shuffled.npy")] == pytest.approx(expected,
                                                                            abs=1e-12)


# --- bootstrap ------------------------------------------------------------------------------

def _bootstrap_reference(x_rdm, targets, samples, seed):
    """numpy + scipy on the draws the docstring promises: sorted draws with replacement,
    the pairs of a stimulus with its own copy left out."""
    n = len(x_rdm)
    rng = np.random.default_rng(seed)
    rows, cols = np.triu_indices(n, 1)
    values = []
    for _ in range(samples):
        chosen = np.sort(rng.integers(0, n, n))
        keep = chosen[rows] != chosen[cols]
        a = x_rdm[np.ix_(chosen, chosen)][rows, cols][keep]
        values.append(np.mean([scipy.stats.spearmanr(
            a, t[np.ix_(chosen, chosen)][rows, cols][keep]).statistic for t in targets]))
    return np.percentile(values, [2.5, 97.5])


def test_bootstrap_intervals_equal_numpy_on_the_same_draws(brain):
    result = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"), bootstrap=30,
                     seed=5)
    again = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"), bootstrap=30,
                    seed=5)
    assert result.intervals == again.intervals
    for key in KEYS:
        x, _ = _rows(brain["file"], key)
        low, high = result.intervals[(key, "rdm:subjects.npy")]
        expected = _bootstrap_reference(1 - np.corrcoef(x), brain["matrices"], 30, 5)
        assert (low, high) == pytest.approx(tuple(expected), abs=1e-12)
        assert low < high
    other_seed = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"),
                         bootstrap=30, seed=6)
    assert other_seed.intervals != result.intervals


def test_bootstrap_between_the_keys_of_a_file(brain):
    result = compare(brain["file"], keys=["pool", "fc"], metric="rsa", bootstrap=20, seed=2)
    x, _ = _rows(brain["file"], "pool/output")
    y, _ = _rows(brain["file"], "fc/output")
    expected = _bootstrap_reference(1 - np.corrcoef(x), [1 - np.corrcoef(y)], 20, 2)
    assert result.intervals[("pool/output", "fc/output")] == pytest.approx(tuple(expected),
                                                                           abs=1e-12)
    low, high = result.intervals[("pool/output", "fc/output")]
    assert low <= result.values[("pool/output", "fc/output")] <= high


# --- bad input ------------------------------------------------------------------------------

def test_bad_brain_inputs_are_refused_in_one_line(brain, tmp_path):
    one = str(brain["folder"] / "one.npy")
    cases = [
        (dict(rdm=one, responses=one), ConfigError, "not both"),
        (dict(rdm=one, other=brain["subset"]), ConfigError, "give one"),
        (dict(rdm=one, metric="cka"), ConfigError, "compared by RSA"),
        (dict(rdm=str(tmp_path / "missing.npy")), ConfigError, "no such file"),
        (dict(index=one), ConfigError, "goes with rdm="),
        (dict(rdm=one, bootstrap=-1), ConfigError, "bootstrap=-1"),
    ]
    np.save(tmp_path / "lopsided.npy", np.arange(16.0).reshape(4, 4))
    cases.append((dict(rdm=str(tmp_path / "lopsided.npy")), ConfigError, "not symmetric"))
    np.save(tmp_path / "odd.npy", np.ones(7))
    cases.append((dict(rdm=str(tmp_path / "odd.npy")), ConfigError, "condensed RDM has"))
    np.save(tmp_path / "short_index.npy", np.arange(5))
    cases.append((dict(rdm=one, index=str(tmp_path / "short_index.npy")), ConfigError,
                  "40 integers"))
    np.save(tmp_path / "far_index.npy", np.arange(SAMPLES) + 1000)
    cases.append((dict(rdm=one, index=str(tmp_path / "far_index.npy")), DataError,
                  "share 0 samples"))
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.zeros((3, 3))
    cases.append((dict(rdm=f"{tmp_path / 'b.h5'}:y"), ConfigError, "has no dataset 'y'"))
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message) as raised:
            compare(brain["file"], **kwargs)
        assert "\n" not in str(raised.value), kwargs


# --- the command ----------------------------------------------------------------------------

def test_cli_writes_values_intervals_and_the_ceiling(brain, tmp_path):
    out = tmp_path / "a long folder name" / "out"
    result = cli(f"file={brain['file']}", f"rdm={brain['folder'] / 'subjects.npy'}",
                 "bootstrap=10", f"out_dir={out}", "plot=false", cwd=tmp_path,
                 module="probe.compare")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["rsa", "rdm:subjects.npy"]
    with (out / "similarity.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["key_a", "key_b", "metric", "value", "ci_low", "ci_high",
                             "ceiling_lower", "ceiling_upper"]
    assert [r["key_a"] for r in rows] == KEYS
    expected = compare(brain["file"], rdm=str(brain["folder"] / "subjects.npy"))
    assert float(rows[1]["value"]) == pytest.approx(
        expected.values[("pool/output", "rdm:subjects.npy")], rel=1e-12)
    assert float(rows[0]["ceiling_upper"]) == pytest.approx(expected.ceiling[1], rel=1e-12)
    bad = cli(f"file={brain['file']}", f"rdm={tmp_path / 'nothing.npy'}", cwd=tmp_path,
              module="probe.compare")
    assert bad.returncode != 0 and "no such file" in bad.stderr
