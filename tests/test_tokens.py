"""dataset=tokens: pre-tokenized ids, from id lists or a flat .npy with offsets, give the very
rows that the same documents give as text."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import assert_same_datasets, no_h5_files
from tests.tiny_text import documents, write_jsonl

pytest.importorskip("transformers")

DOCS = documents(7, seed=3, high=15)
KEYS = ("index", "offsets", "input_ids", "positions", "transformer.h.1/output")


@pytest.fixture(scope="module")
def corpus(tiny_lm, tmp_path_factory):
    """The documents as text, as id lists in jsonl, and as a flat .npy with offsets."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("ids")
    ids = [AutoTokenizer.from_pretrained(tiny_lm)(text)["input_ids"] for text in DOCS]
    with (folder / "ids.jsonl").open("w") as stream:
        for n, row in enumerate(ids):
            stream.write(json.dumps({"input_ids": row, "label": n % 2}) + "\n")
    np.save(folder / "flat.npy", np.concatenate(ids).astype(np.int32))
    np.save(folder / "offsets.npy", np.concatenate([[0], np.cumsum([len(r) for r in ids])]))
    return {"text": write_jsonl(folder / "docs.jsonl", DOCS), "folder": folder, "ids": ids}


def _run(make_cfg, tiny_lm, tmp_path, name, *dataset):
    return probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", *dataset,
                              "layers=[transformer.h.1]", "batch_size=3",
                              output=tmp_path / f"{name}.h5"))


def test_ids_give_the_rows_of_the_same_text(make_cfg, tiny_lm, tmp_path, corpus):
    folder = corpus["folder"]
    text = _run(make_cfg, tiny_lm, tmp_path, "text", "dataset=text",
                f"dataset.path={corpus['text']}")
    lists = _run(make_cfg, tiny_lm, tmp_path, "lists", "dataset=tokens",
                 f"dataset.path={folder / 'ids.jsonl'}", "dataset.label_column=label")
    flat = _run(make_cfg, tiny_lm, tmp_path, "flat", "dataset=tokens",
                f"dataset.path={folder / 'flat.npy'}", f"dataset.offsets={folder / 'offsets.npy'}")
    with h5py.File(text, "r") as a, h5py.File(lists, "r") as b:
        for key in KEYS:
            np.testing.assert_allclose(a[key][:], b[key][:], rtol=1e-6, atol=1e-6, err_msg=key)
        assert b["target"][:].tolist() == [n % 2 for n in range(len(DOCS))]
    assert_same_datasets(lists, flat, KEYS)
    with probe.open(flat) as f:
        np.testing.assert_array_equal(f["input_ids"][:], np.concatenate(corpus["ids"]))


def test_max_length_truncates_and_says_how_many(make_cfg, tiny_lm, tmp_path, corpus):
    folder = corpus["folder"]
    path = _run(make_cfg, tiny_lm, tmp_path, "cut", "dataset=tokens",
                f"dataset.path={folder / 'ids.jsonl'}", "dataset.max_length=5")
    with probe.open(path) as f:
        assert np.diff(f.offsets).max() == 5
        assert f.attrs["truncated_documents"] == sum(len(r) > 5 for r in corpus["ids"])


@pytest.mark.parametrize(("write", "dataset", "error", "message"), [
    (None, ["dataset.path=/no/such/ids.jsonl"], DataError, "no such file"),
    (lambda d: np.save(d / "x.npy", np.arange(4)), ["dataset.path={d}/x.npy"], ConfigError,
     r"a flat .npy of ids: set dataset.offsets="),
    (lambda d: (np.save(d / "x.npy", np.arange(4)), np.save(d / "o.npy", np.array([0, 3]))),
     ["dataset.path={d}/x.npy", "dataset.offsets={d}/o.npy"], DataError,
     r"does not bound the 4 ids"),
    (lambda d: (d / "x.jsonl").write_text('{"input_ids": [1, 2]}\n{"input_ids": "abc"}\n'),
     ["dataset.path={d}/x.jsonl"], ConfigError, r"row 1 of .*: not a list of integer ids"),
    (lambda d: (d / "x.jsonl").write_text('{"ids": [1, 2]}\n'), ["dataset.path={d}/x.jsonl"],
     ConfigError, r"dataset.column='input_ids' is not a column of .*; it has ids"),
    # caught in the plan, not by the model mid-run: neither is the first document
    (lambda d: (d / "x.jsonl").write_text(json.dumps({"input_ids": [1, 2]}) + "\n"
                                          + json.dumps({"input_ids": list(range(3, 203))})),
     ["dataset.path={d}/x.jsonl"], ConfigError,
     r"^dataset sample 1 has 200 tokens, beyond the 128 positions of GPT2LMHeadModel \(1 of "
     r"2 are\); set dataset.max_length=128 \(or less\) to cut them$"),
    (lambda d: (d / "x.jsonl").write_text('{"input_ids": [1, 2]}\n{"input_ids": [3]}\n'
                                          '{"input_ids": [4, 99999, 5]}\n'),
     ["dataset.path={d}/x.jsonl"], ConfigError,
     r"^dataset sample 2 holds token id 99999, outside the vocabulary of GPT2LMHeadModel "
     r"\(ids 0 to \d+\); are the ids from this model's tokenizer\?$"),
    (lambda d: (np.save(d / "x.npy", np.array([1, 2, 3, -4, 5])),
                np.save(d / "o.npy", np.array([0, 2, 5]))),
     ["dataset.path={d}/x.npy", "dataset.offsets={d}/o.npy"], ConfigError,
     r"^dataset sample 1 holds token id -4, outside the vocabulary"),
])
def test_bad_ids_are_one_line(make_cfg, tiny_lm, tmp_path, write, dataset, error, message):
    if write is not None:
        write(tmp_path)
    with pytest.raises(error, match=message):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=tokens",
                           *(d.format(d=tmp_path) for d in dataset), "layers=[transformer.h.1]"))
    assert no_h5_files(tmp_path)


def test_ids_that_max_length_cuts_off_are_not_checked(make_cfg, tiny_lm, tmp_path):
    """Only the ids a sample feeds the model count: these are cut by max_length."""
    (tmp_path / "x.jsonl").write_text(json.dumps({"input_ids": [1, 2]}) + "\n"
                                      + json.dumps({"input_ids": [*range(3, 150), 99999]}))
    path = probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=tokens",
                              f"dataset.path={tmp_path / 'x.jsonl'}", "dataset.max_length=100",
                              "layers=[transformer.h.1]"))
    with probe.open(path) as f:
        assert np.diff(f.offsets).tolist() == [2, 100]
