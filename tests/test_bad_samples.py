"""Bad samples mid-run: one line naming the sample, or, with dataset.on_error=skip, left out,
logged and recorded in /skipped, in a file that resumes and merges like any other."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest

import probe
from probe.errors import DataError
from probe.file.merge import merge
from tests.conftest import interrupt_after, no_h5_files

RUN = ["model=resnet18", "layers=[fc]", "dataset=imagefolder", "dataset.image_size=32",
       "batch_size=2", "output.commit_every=1"]


@pytest.fixture
def folder(tmp_path):
    """Two classes of five PNG files; class b's file 2.png is not an image."""
    from PIL import Image

    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (36, 40, 3), dtype=np.uint8)).save(
                root / label / f"{i}.png")
    (root / "b" / "2.png").write_bytes(b"not a picture")
    return root


def test_a_broken_image_is_one_line_naming_it(make_cfg, folder, tmp_path):
    with pytest.raises(DataError, match=r"dataset sample 7 \(b/2.png\) cannot be loaded "
                                        r"\(UnidentifiedImageError: .*\); fix or remove it, or "
                                        r"set dataset.on_error=skip") as failed:
        probe.run(make_cfg(*RUN, f"dataset.root={folder}"))
    assert "\n" not in str(failed.value)
    with probe.open(tmp_path / "features.h5", allow_partial=True) as f:  # kept what was done
        assert f.index.tolist() == list(range(6))


def test_with_loader_workers_too(make_cfg, folder):
    with pytest.raises(DataError, match=r"dataset sample 7 \(b/2.png\)") as failed:
        probe.run(make_cfg(*RUN, f"dataset.root={folder}", "num_workers=1"))
    assert "Traceback" not in str(failed.value) and "\n" not in str(failed.value)


def test_skip_leaves_it_out_and_records_it(make_cfg, folder, caplog):
    with caplog.at_level(logging.WARNING):
        path = probe.run(make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip"))
    assert "left out (dataset.on_error=skip): dataset sample 7 (b/2.png)" in caplog.text
    with probe.open(path) as f:
        assert f.index.tolist() == [0, 1, 2, 3, 4, 5, 6, 8, 9]
        assert f["skipped"][:].tolist() == [7] and f.attrs["num_skipped"] == 1
        assert [s.decode() if isinstance(s, bytes) else s for s in f["file"][:]] == [
            "a/0.png", "a/1.png", "a/2.png", "a/3.png", "a/4.png", "b/0.png", "b/1.png",
            "b/3.png", "b/4.png"]
        assert list(f.attrs["classes"]) == ["a", "b"]
        assert f.num_rows == 9 and f.attrs["num_samples"] == 9


def test_a_run_with_skipped_samples_resumes_to_the_same_file(make_cfg, folder, tmp_path,
                                                             monkeypatch):
    whole = probe.run(make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip",
                               output=tmp_path / "whole.h5"))
    for stop_after in (2, 3, 4):  # before, at and after the batch that leaves a sample out
        out = tmp_path / f"resumed{stop_after}.h5"
        cfg = make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip", output=out)
        interrupt_after(monkeypatch, stop_after)
        with pytest.raises(KeyboardInterrupt):
            probe.run(cfg)
        monkeypatch.undo()
        probe.run(cfg)
        with h5py.File(whole, "r") as a, h5py.File(out, "r") as b:
            for key in ("index", "skipped", "fc/output", "file"):
                np.testing.assert_array_equal(a[key][:], b[key][:], err_msg=key)


def test_shards_with_skipped_samples_merge(make_cfg, folder, tmp_path):
    one = probe.run(make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip",
                             output=tmp_path / "one.h5"))
    shards = [probe.run(make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip",
                                 "shard.count=2", f"shard.index={k}",
                                 output=tmp_path / f"s{k}" / "features.h5")) for k in range(2)]
    for copy in (False, True):
        merged = merge(tmp_path / f"merged{copy}.h5", shards, copy=copy)
        with h5py.File(one, "r") as a, h5py.File(merged, "r") as b:
            # the shards no longer interleave: their rows come shard after shard
            assert b.attrs["merged_order"] == "shards"
            order = np.argsort(b["index"][:])
            for key in ("index", "fc/output", "file"):
                if key == "fc/output":  # other batches: float rounding may differ
                    np.testing.assert_allclose(a[key][:], b[key][:][order], atol=1e-5)
                else:
                    np.testing.assert_array_equal(a[key][:], b[key][:][order], err_msg=key)
            assert b["skipped"][:].tolist() == [7] and b.attrs["num_skipped"] == 1


def test_bad_documents_of_a_corpus(make_cfg, tiny_lm, tmp_path, caplog):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "the cat sat"}\n{"text": null}\n{"text": "a dog ran"}\n'
                      '{"text": 17}\n{"text": "the end"}\n')
    run = ["model=transformers", f"model.name={tiny_lm}", "dataset=text",
           f"dataset.path={corpus}", "layers=[transformer.h.0]", "batch_size=2"]
    with pytest.raises(DataError, match=r"dataset sample 1 \(row 1 of .*docs.jsonl\) cannot be "
                                        r"loaded \(ValueError: its 'text' is None, not text\)"):
        probe.run(make_cfg(*run))
    with caplog.at_level(logging.WARNING):
        path = probe.run(make_cfg(*run, "dataset.on_error=skip", output=tmp_path / "ok.h5"))
    assert "left out (dataset.on_error=skip): dataset sample 3 (row 3" in caplog.text
    with probe.open(path) as f:
        assert f.index.tolist() == [0, 2, 4] and f["skipped"][:].tolist() == [1, 3]
        assert len(f.offsets) == 4
        # every token row is there (the bad documents sort first in their group, alone)
        assert f["transformer.h.0/output"].shape == (int(f.offsets[-1]), 32)
        assert f["input_ids"].shape == (int(f.offsets[-1]),)


@pytest.mark.parametrize(("content", "message"), [
    ("", r"holds no documents \(empty\)"),
    ('{"text": "fine"}\n{"text": "broken\n', r"cannot be read as json \(JSON parse error"),
])
def test_corpora_that_cannot_be_read(make_cfg, tiny_lm, tmp_path, content, message):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(content)
    with pytest.raises(DataError, match=message):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                           f"dataset.path={corpus}", "layers=[transformer.h.0]"))
    assert no_h5_files(tmp_path)


def test_skip_when_the_very_first_sample_is_broken(make_cfg, folder):
    (folder / "a" / "0.png").write_bytes(b"not a picture either")
    path = probe.run(make_cfg(*RUN, f"dataset.root={folder}", "dataset.on_error=skip"))
    with probe.open(path) as f:  # the dry run and the targets come from the first that loads
        assert f["skipped"][:].tolist() == [0, 7] and f.index.tolist()[0] == 1
        assert f.target.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
