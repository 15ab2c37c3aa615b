"""Encoding models over timed files: the rows' times come from the file's /onset, each /file is
a run of its own (runs=), delays and the HRF stop at a run's start, the folds leave whole runs
out. Stored onsets give the numbers of the same onsets given by hand, runs give numpy's per-run
bins, the HRF nilearn's kernel convolved by numpy; every bad input is one line."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from probe.analyses.encode import encode
from probe.analyses.encode.design import Delayed, FileRows
from probe.analyses.encode.runs import Runs
from probe.analyses.encode.timeline import open_timeline
from probe.analyses.encode.times import stored_times
from probe.errors import ConfigError
from probe.file.read import FeatureFile
from tests.conftest import cli, error_line
from tests.test_compare import write_probe_file
from tests.test_encode_time import _delayed

PER_TR, TR = 4, 2.0  # a window every 0.5 s, four per TR of 2 s
MOVIES = {"a.mp4": 40, "b.mp4": 30}  # each movie's TRs: one fMRI run each
DELAY = 2

# small matrices gain nothing from threads (tests/conftest.py one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _timed_file(path, movies, seed=0):
    """A video run's file: windows every 0.5 s of each movie (``/onset`` from the start of its
    ``/file``), its rows shuffled as a merged file may hold them. Whole-number features, so
    that the means of four per TR are exact in float32 (a file written by hand holds them)."""
    rng = np.random.default_rng(seed)
    names = np.concatenate([[name] * (trs * PER_TR) for name, trs in movies.items()])
    onsets = np.concatenate([np.arange(trs * PER_TR) * TR / PER_TR for trs in movies.values()])
    layers = {"early/output": rng.integers(-8, 9, size=(len(names), 5)).astype(float),
              "middle/output": rng.integers(-8, 9, size=(len(names), 7)).astype(float)}
    order = rng.permutation(len(names))
    write_probe_file(path, order, {key: x[order] for key, x in layers.items()})
    with h5py.File(path, "r+") as f:  # as dataset=video writes them (probe.file.format)
        for name, values in (("onset", onsets[order]), ("duration", np.full(len(order), 0.5))):
            f.create_dataset(name, data=values).attrs["dims"] = ["sample"]
        f.create_dataset("file", data=names[order].astype(object), dtype=h5py.string_dtype())
        f["file"].attrs["dims"] = ["sample"]
    return {"file": path, "layers": layers, "onsets": onsets, "names": names}


def _per_run(x, movies, step):
    # numpy's own: each movie's windows averaged per TR, then ``step`` within each run
    out, start = [], 0
    for trs in movies.values():
        rows = x[start:start + trs * PER_TR].reshape(trs, PER_TR, -1).mean(1)
        out.append(step(rows))
        start += trs * PER_TR
    return np.concatenate(out)


def _bold(rng, design, columns=6):
    signal = design @ rng.normal(size=(design.shape[1], columns))
    return signal + 0.3 * signal.std(0) * rng.normal(size=signal.shape)


@pytest.fixture(scope="module")
def movies(tmp_path_factory):
    """Two movies of 40 and 30 TRs, the BOLD of each run two TRs late from the middle layer;
    runs.npy as numbers and as names, the onsets by hand."""
    folder = tmp_path_factory.mktemp("movies")
    made = _timed_file(folder / "movies.h5", MOVIES)
    late = _per_run(made["layers"]["middle/output"], MOVIES, lambda x: _delayed(x, [DELAY]))
    np.save(folder / "bold.npy", _bold(np.random.default_rng(1), late))
    runs = np.repeat(np.arange(len(MOVIES)), list(MOVIES.values()))
    np.save(folder / "runs.npy", runs)
    np.save(folder / "names.npy", np.array(list(MOVIES))[runs])
    np.save(folder / "onsets.npy", made["onsets"])  # by dataset sample: the rows' /index
    return {**made, "bold": folder / "bold.npy", "runs": folder / "runs.npy",
            "names": folder / "names.npy", "hand": folder / "onsets.npy", "folder": folder}


@pytest.fixture(scope="module")
def movie(tmp_path_factory):
    """One movie of 70 TRs, a file of one /file."""
    folder = tmp_path_factory.mktemp("movie")
    made = _timed_file(folder / "movie.h5", {"m.mp4": 70}, seed=2)
    late = _per_run(made["layers"]["middle/output"], {"m.mp4": 70},
                    lambda x: _delayed(x, [DELAY]))
    np.save(folder / "bold.npy", _bold(np.random.default_rng(3), late))
    np.save(folder / "onsets.npy", made["onsets"])
    return {**made, "bold": folder / "bold.npy", "hand": folder / "onsets.npy"}


def _same(ours, theirs):
    assert [r["key"] for r in ours] == [r["key"] for r in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a["fold_r"], b["fold_r"]) and np.array_equal(a["alpha"],
                                                                           b["alpha"])


def test_the_files_onsets_give_the_scores_of_the_same_onsets_by_hand(movie):
    stored = encode(movie["file"], movie["bold"], tr=TR, delays=[DELAY])
    by_hand = encode(movie["file"], movie["bold"], tr=TR, onsets=movie["hand"], delays=[DELAY])
    _same(stored, by_hand)
    assert stored[1]["key"] == "middle/output" and stored[1]["score"] > 0.8, stored[1]["score"]
    assert stored[0]["design"]["onsets"] == "the file's /onset"
    assert by_hand[0]["design"]["onsets"] == str(movie["hand"])


def test_token_rows_go_by_the_files_onset_per_row_and_samples_by_their_first_row(tmp_path):
    # a word-timed story: /onset per token row; a pooled key of one row per sample beside it
    rng = np.random.default_rng(4)
    lengths = rng.integers(2, 6, size=90)
    tokens = rng.normal(size=(int(lengths.sum()), 6))
    pooled = rng.normal(size=(90, 4))
    path = write_probe_file(tmp_path / "story.h5", np.arange(90),
                            {"h/output": tokens, "pooled/output": pooled},
                            token_lengths=lengths)
    words = np.sort(rng.uniform(0, 119.0, size=len(tokens)))
    with h5py.File(path, "r+") as f:
        f.create_dataset("onset", data=words).attrs["dims"] = ["token"]
        f.create_dataset("file", data=np.array(["story.txt"] * 90, dtype=object),
                         dtype=h5py.string_dtype())
    np.save(tmp_path / "bold.npy", rng.normal(size=(60, 5)))
    np.save(tmp_path / "words.npy", words)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    np.save(tmp_path / "first.npy", words[offsets[:-1]])
    stored = encode(path, tmp_path / "bold.npy", ["h", "pooled"], tr=TR)
    _same(stored[:1], encode(path, tmp_path / "bold.npy", ["h"], tr=TR,
                             onsets=tmp_path / "words.npy"))
    _same(stored[1:], encode(path, tmp_path / "bold.npy", ["pooled"], tr=TR,
                             onsets=tmp_path / "first.npy"))


def test_frames_of_timed_samples_follow_the_frame_rate_or_sit_at_their_samples_onset(tmp_path):
    # two windows of one clip, at 0 s and 10 s, of 3 and 2 frames: /onset per sample
    path = write_probe_file(tmp_path / "clip.h5", np.arange(2),
                            {"a/output": np.zeros((5, 2)), "s/output": np.zeros((2, 2))},
                            token_lengths=[3, 2])
    with h5py.File(path, "r+") as f:
        f.create_dataset("onset", data=[0.0, 10.0]).attrs["dims"] = ["sample"]
    with FeatureFile(path) as f:
        np.testing.assert_array_equal(stored_times(f, "a/output"), [0, 0, 0, 10, 10])
        np.testing.assert_array_equal(stored_times(f, "s/output"), [0, 10])
    with h5py.File(path, "r+") as f:
        f.attrs["frame_rate"] = 50.0
    with FeatureFile(path) as f:
        np.testing.assert_allclose(stored_times(f, "a/output"), [0, 0.02, 0.04, 10, 10.02])


def test_runs_bin_each_files_rows_into_its_own_trs_as_numpy_does(movies):
    x = movies["layers"]["middle/output"]
    want = _per_run(x, MOVIES, lambda rows: rows)
    with FeatureFile(movies["file"]) as f:
        # the rows are shuffled: the file's rows in its own order
        timeline = open_timeline(f, TR, None, movies["names"], None, len(want))
        source = FileRows(f, "middle/output", np.arange(f.num_rows), torch.device("cpu"), None)
        design = timeline.design(f, "middle/output", source, 1 << 26)
        np.testing.assert_array_equal(design.read(0, len(want)).numpy(), want)
        delayed = Delayed(design, [0, 1, 3], timeline.runs.first_row)
        blocks = [delayed.read(a, min(a + 7, len(want))).numpy()
                  for a in range(0, len(want), 7)]
        # a delayed row never reaches back into the run before: zeros at each run's start
        np.testing.assert_array_equal(np.concatenate(blocks), _per_run(
            x, MOVIES, lambda rows: _delayed(rows, [0, 1, 3])))
        first_of_b = MOVIES["a.mp4"]
        row = delayed.read(first_of_b, first_of_b + 1).numpy()[0]
        assert (row[7:] == 0).all() and (row[:7] == want[first_of_b]).all()


def test_runs_by_number_by_name_and_with_onsets_by_hand_agree_with_a_file_binned_by_hand(
        movies, tmp_path):
    numbers = encode(movies["file"], movies["bold"], tr=TR, runs=movies["runs"],
                     delays=[1, DELAY])
    _same(numbers, encode(movies["file"], movies["bold"], tr=TR, runs=movies["names"],
                          delays=[1, DELAY]))
    # onsets by hand with runs: each from the start of its sample's file, as the stored ones
    _same(numbers, encode(movies["file"], movies["bold"], tr=TR, runs=movies["runs"],
                          onsets=movies["hand"], delays=[1, DELAY]))
    assert numbers[0]["design"]["runs"] == list(MOVIES)
    assert numbers[0]["design"]["run_trs"] == list(MOVIES.values())
    # the oracle: the per-run bins and delays by numpy, a row per TR in a file of their own
    binned = {key: _per_run(x, MOVIES, lambda rows: _delayed(rows, [1, DELAY]))
              for key, x in movies["layers"].items()}
    by_hand = write_probe_file(tmp_path / "by_hand.h5", np.arange(70), binned)
    theirs = encode(by_hand, movies["bold"], delays=[0])  # contiguous folds, rows as they are
    for a, b in zip(numbers, theirs, strict=True):
        np.testing.assert_allclose(a["fold_r"], b["fold_r"], rtol=0, atol=1e-9)


def test_folds_leave_whole_runs_out_where_there_are_enough(tmp_path):
    runs = Runs(("a", "b", "c", "d", "e"), np.array([0, 10, 25, 31, 40]),
                np.array([10, 15, 6, 9, 12]), np.repeat(np.arange(5), [10, 15, 6, 9, 12]))
    fold_of, how = runs.fold_of(3)
    assert "leave-runs-out" in how
    for run in range(5):  # each run lies in one fold, and the folds are consecutive runs
        assert len(set(fold_of[runs.of_row == run])) == 1
    assert list(dict.fromkeys(fold_of)) == [0, 1, 2] and (np.diff(fold_of) >= 0).all()
    fold_of, how = runs.fold_of(6)  # fewer runs than folds: contiguous blocks
    assert "contiguous" in how and (np.diff(fold_of) >= 0).all() and fold_of.max() == 5
    # three movies, three folds: each fold tests on a movie no training row came from
    made = _timed_file(tmp_path / "three.h5", {"a": 20, "b": 15, "c": 25})
    np.save(tmp_path / "runs.npy", np.repeat([0, 1, 2], [20, 15, 25]))
    np.save(tmp_path / "bold.npy", np.random.default_rng(5).normal(size=(60, 3)))
    out = tmp_path / "out"
    done = cli(f"file={made['file']}", f"targets={tmp_path / 'bold.npy'}", "tr=2",
               f"runs={tmp_path / 'runs.npy'}", "folds=3", "hrf=glover", "delays=[0,1]",
               f"out_dir={out}", "plot=false", "keys=[early]", cwd=tmp_path,
               module="probe.encode")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leave-runs-out" in done.stderr
    with h5py.File(out / "scores.h5") as h5:  # the design, as the command was given it
        assert h5.attrs["tr"] == 2.0 and h5.attrs["hrf"] == "glover"
        assert list(h5.attrs["runs"]) == ["a", "b", "c"]
        assert list(h5.attrs["run_trs"]) == [20, 15, 25] and list(h5.attrs["delays"]) == [0, 1]
        assert "leave-runs-out" in h5.attrs["folds_by"]


@pytest.mark.parametrize("hrf", ["spm", "glover"])
def test_the_hrf_is_nilearns_kernel_convolved_within_each_run(movies, hrf):
    from nilearn.glm.first_level import glover_hrf, spm_hrf

    kernel = {"spm": spm_hrf, "glover": glover_hrf}[hrf](TR, oversampling=1)
    x = movies["layers"]["early/output"]

    def convolved(rows):  # causal, and only over this run's rows
        return np.stack([np.convolve(rows[:, j], kernel)[:len(rows)]
                         for j in range(rows.shape[1])], 1)

    want = _per_run(x, MOVIES, convolved)
    with FeatureFile(movies["file"]) as f:
        timeline = open_timeline(f, TR, None, movies["runs"], hrf, len(want))
        source = FileRows(f, "early/output", np.arange(f.num_rows), torch.device("cpu"), None)
        design = timeline.design(f, "early/output", source, 1 << 26)
        np.testing.assert_allclose(design.read(0, len(want)).numpy(), want, rtol=0, atol=1e-12)
        # with delays: the delays of the convolved rows, within each run too
        delayed = Delayed(design, [1, 2], timeline.runs.first_row).read(0, len(want)).numpy()
        np.testing.assert_allclose(delayed, _per_run(
            x, MOVIES, lambda rows: _delayed(convolved(rows), [1, 2])), rtol=0, atol=1e-12)
    (result,) = encode(movies["file"], movies["bold"], ["early"], tr=TR, runs=movies["runs"],
                       hrf=hrf)
    assert result["design"]["hrf"] == hrf and np.isfinite(result["r"]).all()


def test_a_brain_that_answers_through_the_hrf_is_found_through_it(movies, tmp_path):
    from nilearn.glm.first_level import spm_hrf

    kernel = spm_hrf(TR, oversampling=1)
    bold = _bold(np.random.default_rng(6), _per_run(
        movies["layers"]["middle/output"], MOVIES,
        lambda rows: np.stack([np.convolve(c, kernel)[:len(c)] for c in rows.T], 1)))
    np.save(tmp_path / "bold.npy", bold)
    through = encode(movies["file"], tmp_path / "bold.npy", ["middle"], tr=TR,
                     runs=movies["runs"], hrf="spm")[0]["score"]
    without = encode(movies["file"], tmp_path / "bold.npy", ["middle"], tr=TR,
                     runs=movies["runs"])[0]["score"]
    assert through > 0.8 and through > without + 0.2, (through, without)


@pytest.fixture(scope="module")
def bad(movies, movie, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    plain = write_probe_file(folder / "plain.h5", np.arange(280),
                             {"early/output": np.ones((280, 2))})
    np.save(folder / "short.npy", np.zeros(69, dtype=np.int64))
    np.save(folder / "unknown.npy", np.array(["a.mp4"] * 40 + ["c.mp4"] * 30))
    np.save(folder / "three.npy", np.repeat([0, 2], [40, 30]))
    np.save(folder / "back.npy", np.repeat([0, 1, 0], [20, 30, 20]))
    np.save(folder / "one.npy", np.zeros(70, dtype=np.int64))
    return {"MOVIES": movies["file"], "MOVIE": movie["file"], "PLAIN": plain,
            "BOLD": movies["bold"], "RUNS": movies["runs"], **{
                name.upper(): folder / f"{name}.npy"
                for name in ("short", "unknown", "three", "back", "one")}}


BAD = [
    ("file=PLAIN tr=2", "has none (tr= and onsets= go together here): give onsets=O.npy"),
    ("file=MOVIES tr=2", "holds rows of 2 files, each a run with a clock of its own; give runs="),
    ("file=MOVIES tr=2 runs=SHORT", "has 69 entries, but the targets have 70 rows"),
    ("file=MOVIES tr=2 runs=UNKNOWN", "names 'c.mp4', which is not a file of"),
    ("file=MOVIES tr=2 runs=THREE", "holds run 2, but"),
    ("file=MOVIES tr=2 runs=BACK", "run 'a.mp4' comes back at targets row 50"),
    ("file=MOVIES tr=2 runs=ONE", "gives no TR to 'b.mp4'"),
    ("file=MOVIES runs=RUNS", "give tr=SECONDS too"),
    ("file=MOVIE hrf=spm", "hrf=spm convolves the rows binned into TRs, and needs tr=SECONDS"),
    ("file=MOVIE tr=2 hrf=foo", "hrf='foo': use spm or glover"),
]


@pytest.mark.parametrize("options, message", BAD)
def test_bad_timed_inputs_are_one_line(bad, options, message):
    kwargs = {}
    for option in options.split():
        name, _, value = option.partition("=")
        kwargs[name] = bad.get(value, value)
    path = kwargs.pop("file")
    kwargs = {k: float(v) if k == "tr" else v for k, v in kwargs.items()}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        encode(path, bad["BOLD"], **kwargs)


@pytest.mark.parametrize("options, message", [BAD[0], BAD[1], BAD[3], BAD[8], BAD[9]])
def test_the_command_says_bad_timed_inputs_in_one_line(bad, options, message, tmp_path):
    args = [f"{name}={bad.get(value, value)}" for name, _, value in
            (option.partition("=") for option in options.split())]
    done = cli(*args, f"targets={bad['BOLD']}", "plot=false", cwd=tmp_path,
               module="probe.encode")
    assert message in error_line(done)


def test_hrf_without_nilearn_says_how_to_install_it(movie, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "nilearn" else find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"hrf= needs nilearn: pip install 'probe\[analysis\]'"):
        encode(movie["file"], movie["bold"], tr=TR, hrf="spm")
