"""Encoding models for naturalistic designs: delays (a finite impulse response), rows placed in
time and averaged into TRs, noise ceilings from repeats. A synthetic brain whose responses are a
delayed linear map of one layer must give away its layer and its delay; every step is checked
against numpy; bad timing is one line."""

from __future__ import annotations

import csv

import h5py
import numpy as np
import pytest
import torch

from probe.analyses.encode import encode
from probe.analyses.encode.ceiling import open_repeats
from probe.analyses.encode.design import Delayed, FileRows, TRBins, row_times
from probe.errors import ConfigError
from probe.file.read import FeatureFile
from tests.conftest import cli, error_line
from tests.test_compare import write_probe_file

TRS, PER_TR, TR = 200, 3, 1.5  # a "movie" of 600 frames, three per TR of 1.5 s
DELAY = 2  # the brain answers two TRs late
LAYERS = ("early", "middle", "late")


# small matrices gain nothing from threads (tests/conftest.py one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _layers(rng, rows):
    early = rng.normal(size=(rows, 10))
    middle = np.tanh(early @ rng.normal(size=(10, 16)))
    late = np.tanh(middle @ rng.normal(size=(16, 8)))
    return {"early/output": early, "middle/output": middle, "late/output": late}


def _delayed(x, delays):
    out = np.zeros((len(x), x.shape[1] * len(delays)))
    for j, d in enumerate(delays):
        out[d:, j * x.shape[1]:(j + 1) * x.shape[1]] = x[:len(x) - d]
    return out


def _bold(rng, x, columns=12, noise=0.3):
    signal = _delayed(x, [DELAY]) @ rng.normal(size=(x.shape[1], columns))
    return signal + noise * signal.std(0) * rng.normal(size=signal.shape)


@pytest.fixture(scope="module")
def movie(tmp_path_factory):
    """Frames every 0.5 s (a file of 600 samples), the BOLD of 200 TRs: the middle layer's
    frames averaged per TR, two TRs late, through a random map, plus noise."""
    folder = tmp_path_factory.mktemp("movie")
    rng = np.random.default_rng(1)
    layers = _layers(rng, TRS * PER_TR)
    path = write_probe_file(folder / "movie.h5", np.arange(TRS * PER_TR), layers)
    onsets = np.arange(TRS * PER_TR) * TR / PER_TR
    np.save(folder / "onsets.npy", onsets)
    binned = layers["middle/output"].reshape(TRS, PER_TR, -1).mean(1)
    np.save(folder / "bold.npy", _bold(rng, binned))
    return {"file": path, "onsets": folder / "onsets.npy", "bold": folder / "bold.npy",
            "layers": layers, "folder": folder}


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """One sample per TR (300), responses two rows late from the middle layer."""
    folder = tmp_path_factory.mktemp("series")
    rng = np.random.default_rng(2)
    layers = _layers(rng, 300)
    path = write_probe_file(folder / "series.h5", np.arange(300), layers)
    np.save(folder / "bold.npy", _bold(rng, layers["middle/output"]))
    return {"file": path, "bold": folder / "bold.npy", "layers": layers, "folder": folder}


def _scores(results):
    return {r["key"].split("/")[0]: r["score"] for r in results}


def test_the_synthetic_brain_gives_away_its_layer_and_its_delay(series):
    found = {(layer, delay): score
             for delay in range(5)
             for layer, score in _scores(encode(series["file"], series["bold"],
                                                delays=[delay])).items()}
    assert max(found, key=found.get) == ("middle", DELAY), found
    assert found[("middle", DELAY)] > 0.8 > found[("middle", DELAY + 1)] + 0.2, found
    fir = _scores(encode(series["file"], series["bold"], delays=[1, 2, 3, 4]))
    assert max(fir, key=fir.get) == "middle" and fir["middle"] > 0.75, fir


def test_a_movie_binned_into_trs_finds_its_layer_and_delay(movie):
    found = {delay: _scores(encode(movie["file"], movie["bold"], delays=[delay], tr=TR,
                                   onsets=movie["onsets"]))
             for delay in range(4)}
    best = max(((layer, delay) for delay, scores in found.items() for layer in scores),
               key=lambda pair: found[pair[1]][pair[0]])
    assert best == ("middle", DELAY), found
    assert found[DELAY]["middle"] > 0.8, found
    # without the delay, the same layer explains far less
    assert found[0]["middle"] < found[DELAY]["middle"] - 0.3, found


def test_tr_bins_and_delays_are_numpys_averages_and_shifts(movie):
    x = movie["layers"]["middle/output"]
    with FeatureFile(movie["file"]) as f:
        times = row_times(f, "middle/output", np.load(movie["onsets"]), "onsets")
        source = FileRows(f, "middle/output", np.arange(f.num_rows), torch.device("cpu"), None)
        binned = TRBins(source, times, TR, TRS, 1 << 26)
        want = x.reshape(TRS, PER_TR, -1).mean(1)
        np.testing.assert_allclose(binned.read(0, TRS).numpy(), want, rtol=0, atol=1e-6)
        delayed = Delayed(binned, [0, 1, 3])
        blocks = [delayed.read(a, min(a + 7, TRS)).numpy() for a in range(0, TRS, 7)]
        np.testing.assert_allclose(np.concatenate(blocks), _delayed(want, [0, 1, 3]),
                                   rtol=0, atol=1e-6)


def test_a_tr_that_holds_no_row_is_zeros(tmp_path):
    path = write_probe_file(tmp_path / "f.h5", np.arange(4), {"a/output": np.ones((4, 2))})
    with FeatureFile(path) as f:
        source = FileRows(f, "a/output", np.arange(4), torch.device("cpu"), None)
        binned = TRBins(source, np.array([0.1, 0.2, 2.5, 2.6]), 1.0, 4, 1 << 20)
        np.testing.assert_array_equal(binned.read(0, 4).numpy()[:, 0], [1, 0, 1, 0])


def test_token_rows_go_by_their_own_onsets_and_frames_by_the_frame_rate(tmp_path):
    lengths = [3, 2]
    values = {"a/output": np.arange(5, dtype=float)[:, None]}
    path = write_probe_file(tmp_path / "t.h5", np.arange(2), values, token_lengths=lengths)
    with h5py.File(path, "r+") as f:
        f["positions"] = np.array([0, 1, 2, 0, 1])
    with FeatureFile(path) as f:
        per_row = np.array([0.0, 0.4, 0.9, 2.0, 2.2])
        np.testing.assert_array_equal(row_times(f, "a/output", per_row, "onsets"), per_row)
        with pytest.raises(ConfigError, match="no frame rate"):
            row_times(f, "a/output", np.array([0.0, 2.0]), "onsets")
    with h5py.File(path, "r+") as f:
        f.attrs["frame_rate"] = 50.0
    with FeatureFile(path) as f:
        np.testing.assert_allclose(row_times(f, "a/output", np.array([0.0, 2.0]), "onsets"),
                                   [0, 0.02, 0.04, 2.0, 2.02])


def test_token_rows_binned_into_trs_are_encoded(tmp_path):
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 6, size=120)
    x = rng.normal(size=(int(lengths.sum()), 6))
    path = write_probe_file(tmp_path / "story.h5", np.arange(120), {"h/output": x},
                            token_lengths=lengths)
    onsets = np.sort(rng.uniform(0, 99.0, size=len(x)))  # each token's word onset
    np.save(tmp_path / "words.npy", onsets)
    bins = np.floor(onsets / 1.0).astype(int)
    binned = np.zeros((100, 6))
    np.add.at(binned, bins, x)
    binned /= np.maximum(np.bincount(bins, minlength=100), 1)[:, None]
    np.save(tmp_path / "bold.npy", _bold(rng, binned, noise=0.1))
    (result,) = encode(path, tmp_path / "bold.npy", tr=1.0, onsets=tmp_path / "words.npy",
                       delays=[DELAY])
    assert result["score"] > 0.8, result["score"]


def test_repeats_give_numpys_split_half_ceiling_and_the_mean_as_targets(series, tmp_path):
    rng = np.random.default_rng(4)
    truth = np.load(series["bold"])
    noise = np.array([0.5, 1.0, 2.0] * 4) * truth.std(0)
    repeats = truth[None] + noise * rng.normal(size=(6, *truth.shape))
    np.save(tmp_path / "repeats.npy", repeats)
    given = encode(series["file"], None, ["middle"], delays=[DELAY],
                   repeats=tmp_path / "repeats.npy")[0]
    np.save(tmp_path / "mean.npy", repeats.mean(0))
    same = encode(series["file"], tmp_path / "mean.npy", ["middle"], delays=[DELAY])[0]
    np.testing.assert_allclose(given["r"], same["r"], rtol=0, atol=1e-12)
    a, b = repeats[0::2].mean(0), repeats[1::2].mean(0)
    half = np.array([np.corrcoef(a[:, v], b[:, v])[0, 1] for v in range(truth.shape[1])])
    rho = 2 * half / (1 + half)
    np.testing.assert_allclose(given["reliability"], rho, rtol=0, atol=1e-12)
    np.testing.assert_allclose(given["r_normalised"], given["r"] / np.sqrt(rho), atol=1e-12)
    # the noisier a target, the lower its ceiling, and the more normalising lifts it
    assert rho[0] > rho[1] > rho[2]
    assert 0.8 < given["score_normalised"] / given["score"] < 1.6


def test_repeats_read_in_column_blocks_match_one_read(tmp_path):
    rng = np.random.default_rng(5)
    repeats = rng.normal(size=(4, 30, 9)) + rng.normal(size=(1, 30, 9))
    with h5py.File(tmp_path / "r.h5", "w") as f:
        f["bold"] = repeats
    opened = open_repeats(f"{tmp_path / 'r.h5'}:bold")
    try:
        whole = opened.reliability(np.arange(30), 1 << 30)
        blocked = opened.reliability(np.arange(30), 1)  # one column at a time
        np.testing.assert_allclose(whole, blocked, rtol=0, atol=1e-15)
        np.testing.assert_allclose(opened.mean(1), repeats.mean(0), atol=1e-15)
    finally:
        opened.close()


@pytest.mark.parametrize("options, message", [
    ({"tr": 1.5}, "tr= and onsets= go together"),
    ({"tr": 0, "onsets": "ONSETS"}, "tr=0 must be the seconds per TR"),
    ({"tr": 1.5, "onsets": "BACKWARDS"}, "must not decrease"),
    ({"tr": 0.5, "onsets": "ONSETS"}, "outside the recording"),
    ({"tr": 1000, "onsets": "ONSETS"}, "longer than the stimulus"),
    ({"delays": [-1, 2]}, "whole numbers of TRs"),
    ({"delays": [1.5]}, "whole numbers of TRs"),
])
def test_bad_timing_is_one_line(movie, options, message, tmp_path):
    np.save(tmp_path / "backwards.npy", np.load(movie["onsets"])[::-1])
    paths = {"ONSETS": movie["onsets"], "BACKWARDS": tmp_path / "backwards.npy"}
    options = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ConfigError, match=message):
        encode(movie["file"], movie["bold"], ["middle"], **options)


def test_delays_need_the_whole_series(tmp_path):
    path = write_probe_file(tmp_path / "gaps.h5", np.array([0, 1, 2, 4, 5, 6, 7, 8, 9, 10]),
                            {"a/output": np.random.default_rng(0).normal(size=(10, 3))})
    np.save(tmp_path / "t.npy", np.zeros((11, 2)))
    with pytest.raises(ConfigError, match="every sample of the time series"):
        encode(path, tmp_path / "t.npy", delays=[1], folds=3)


def test_repeats_of_other_rows_are_refused(series, tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((300, 12)))
    with pytest.raises(ConfigError, match=r"give \(R, N, V\)"):
        encode(series["file"], None, repeats=tmp_path / "flat.npy")
    np.save(tmp_path / "short.npy", np.zeros((3, 200, 12)))
    with pytest.raises(ConfigError, match="must be of the same rows"):
        encode(series["file"], series["bold"], repeats=tmp_path / "short.npy")


def test_the_command_writes_the_ceiling_and_says_the_folds_are_contiguous(series, tmp_path):
    rng = np.random.default_rng(6)
    truth = np.load(series["bold"])
    np.save(tmp_path / "repeats.npy", truth[None] + rng.normal(size=(4, *truth.shape)))
    out = tmp_path / "out dir"
    done = cli(f"file={series['file']}", f"repeats={tmp_path / 'repeats.npy'}",
               "delays=[1,2,3]", f"out_dir={out}", "plot=false", cwd=tmp_path,
               module="probe.encode")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "contiguous" in done.stderr and "normalised" in done.stdout
    with (out / "encoding.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert list(rows[0]) == ["key", "score", "score_normalised"]
    best = max(rows, key=lambda row: float(row["score_normalised"]))
    assert best["key"] == "middle/output"
    with h5py.File(out / "scores.h5") as h5:
        assert h5["reliability"].shape == (12,) and h5["r_normalised/middle/output"].shape == (12,)
    missing = cli(f"file={series['file']}", "delays=[1]", cwd=tmp_path, module="probe.encode")
    assert missing.returncode != 0 and "targets" in error_line(missing)


def test_bands_weigh_the_keys_as_himalaya_does_on_its_own_kernels(series):
    pytest.importorskip("himalaya")
    from himalaya.backend import set_backend
    from himalaya.kernel_ridge import ColumnKernelizer, Kernelizer, MultipleKernelRidgeCV

    from probe.analyses.encode.bands import ITERATIONS
    from probe.analyses.encode.ridge import deal_folds, inner_splits, pearson_columns

    results = encode(series["file"], series["bold"], ["early"], delays=[DELAY],
                     bands=["early", "middle"], folds=3)
    banded = results[-1]
    assert banded["key"] == "early/output+middle/output" and banded["solver"] == "banded"
    # the band the responses came from outweighs the other, and the pair beats early alone
    weights = banded["band_weights"].mean((0, 2))
    assert weights[1] > 0.7 and banded["score"] > results[0]["score"] + 0.08, weights
    # the oracle: himalaya on the delayed features themselves, its own linear kernels
    layers = series["layers"]
    x = np.concatenate([_delayed(layers["early/output"], [DELAY]),
                        _delayed(layers["middle/output"], [DELAY])], 1)
    x = x.astype(np.float32).astype(np.float64)  # as the file stores the rows
    y = np.load(series["bold"])
    fold_of = deal_folds(300, 3, 0, contiguous=True)
    members = [np.flatnonzero(fold_of == g) for g in range(3)]
    set_backend("torch")
    try:
        kernels = ColumnKernelizer([("early", Kernelizer(), slice(0, 10)),
                                    ("middle", Kernelizer(), slice(10, 26))])
        for f in range(3):
            train, inner = inner_splits(members, f)
            model = MultipleKernelRidgeCV(
                kernels="precomputed", solver="random_search", cv=inner, random_state=0,
                fit_intercept=True,
                solver_params={"n_iter": ITERATIONS, "alphas": np.array(
                    [0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8]),
                    "progress_bar": False})
            model.fit(kernels.fit_transform(x[train]), y[train])
            prediction = model.predict(kernels.transform(x[members[f]])).cpu().numpy()
            np.testing.assert_allclose(banded["fold_r"][f],
                                       pearson_columns(prediction, y[members[f]]), atol=1e-6)
    finally:
        set_backend("numpy")


def test_bands_need_two_keys(series):
    with pytest.raises(ConfigError, match="two or more keys"):
        encode(series["file"], series["bold"], bands=["early"])
