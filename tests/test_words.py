"""Word-timed stories (dataset=text on a .tsv, or a .csv with an onset column): each token takes
its word's onset; the tokens are the story's text's; each window stores the tokens it owns, and
each such row equals a forward of the tiny model over that window, computed here with
transformers alone (with context_stride=1: the context_tokens tokens that end at the token);
shards merge into the unsharded file; every bad table or key is one line and no file. A tiny
GPT-2 and tokenizer trained here; no downloads."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError, OutputError
from probe.file.merge import merge
from tests.conftest import no_h5_files
from tests.tiny_text import documents

pytest.importorskip("transformers")

LAYER = "transformer.h.0"  # its output is hidden_states[1] (the last has the final norm)
WORDS = documents(1, seed=3, low=24, high=24)[0].split()  # about 100 tokens of the tiny BPE
ONSETS = [round(0.3 * n, 2) for n in range(len(WORDS))]


def _write(path, rows, header=("word", "onset", "offset")):
    """A table of ``rows`` under ``header``, tab- or comma-separated by the path's suffix."""
    sep = "\t" if path.suffix == ".tsv" else ","
    path.write_text("".join(sep.join(map(str, row)) + "\n" for row in [header, *rows]))
    return path


def _story(path, words=WORDS, onsets=ONSETS):
    return _write(path, [(w, t, round(t + 0.2, 2)) for w, t in zip(words, onsets, strict=True)])


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    return _story(tmp_path_factory.mktemp("story") / "story.tsv")


@pytest.fixture(scope="module")
def lm(tiny_lm):
    """The model and tokenizer loaded by transformers alone, and the story's token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    return model, tokenizer, tokenizer(" ".join(WORDS))["input_ids"]


@pytest.fixture
def words_cfg(make_cfg, tiny_lm, story):
    def make(*overrides: str, output=None):
        path = [] if any(o.startswith("dataset.path=") for o in overrides) else [
            f"dataset.path={story}"]
        return make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text", *path,
                        f"layers=[{LAYER}]", "batch_size=8", *overrides, output=output)
    return make


def _hidden(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True,
                     use_cache=False).hidden_states[1][0].numpy()


def _windows(length: int, tokens: int, stride: int) -> list[tuple[int, int]]:
    # the rule, as the docs say it: starts 0, stride, ... until a window reaches the end
    starts = [0]
    while starts[-1] + tokens < length:
        starts.append(starts[-1] + stride)
    return [(s, min(s + tokens, length)) for s in starts]


def test_tokens_are_the_texts_and_take_their_words_onsets(words_cfg, lm):
    _, tokenizer, ids = lm
    # each word's tokens, from the texts of the words up to it: a byte-level BPE splits at the
    # spaces, so the text of the first k words is tokenized as a prefix of the whole
    ends = [len(tokenizer(" ".join(WORDS[:k + 1]))["input_ids"]) for k in range(len(WORDS))]
    want = np.repeat(ONSETS, np.diff([0, *ends]))
    path = probe.run(words_cfg("dataset.context_tokens=16"))
    with probe.open(path) as f:
        np.testing.assert_array_equal(f["input_ids"][:], ids)  # once each, in order
        np.testing.assert_array_equal(f["onset"][:], want)
        assert f["onset"].dtype == np.float64 and len(want) == len(ids) > 40
        assert f.num_rows == len(_windows(len(ids), 16, 8))
        assert list(f["file"].asstr()[:]) == ["story.tsv"] * f.num_rows
        assert {k: f.attrs[k] for k in ("context_tokens", "context_stride", "word_column",
                                        "onset_column", "offset_column")} == {
            "context_tokens": 16, "context_stride": 8, "word_column": "word",
            "onset_column": "onset", "offset_column": "offset"}


def test_stride_one_rows_equal_the_context_that_ends_at_each_token(words_cfg, lm):
    model, _, ids = lm
    # the first 12 windows (of len(ids) - 7): the first owns 8 tokens, each later one its last
    path = probe.run(words_cfg("dataset.context_tokens=8", "dataset.context_stride=1",
                               "limit=12", "batch_size=12"))
    with probe.open(path) as f:
        rows, positions = f[f"{LAYER}/output"][:], f["positions"][:]
        assert f.num_rows == 12 and len(rows) == 8 + 11
    np.testing.assert_array_equal(positions, np.minimum(np.arange(len(rows)), 7))
    for t in range(len(rows)):
        want = _hidden(model, ids[max(0, t - 7):t + 1])[-1]
        np.testing.assert_allclose(rows[t], want, rtol=1e-5, atol=1e-5, err_msg=f"token {t}")


def test_a_larger_stride_takes_each_row_from_its_owning_window(words_cfg, lm):
    model, _, ids = lm
    path = probe.run(words_cfg("dataset.context_tokens=16", "dataset.context_stride=5"))
    windows = _windows(len(ids), 16, 5)
    with probe.open(path) as f:
        assert f.num_rows == len(windows)
        owned = 0  # the tokens the windows before it hold
        for k, (start, stop) in enumerate(windows):
            hidden = _hidden(model, ids[start:stop])[owned - start:]
            np.testing.assert_allclose(f.rows_of(f"{LAYER}/output", k), hidden, rtol=1e-5,
                                       atol=1e-5, err_msg=f"window {k}")
            # each row saw between 16 - 5 + 1 and 16 tokens, after the first window
            assert (f.rows_of("positions", k) + 1 >= (12 if k else 1)).all()
            owned = stop


def test_shards_merge_into_the_unsharded_file(words_cfg, tmp_path):
    keys = ("input_ids", "onset", "positions", f"{LAYER}/output")
    single = probe.run(words_cfg("dataset.context_tokens=16", output=tmp_path / "one.h5"))
    shards = [probe.run(words_cfg("dataset.context_tokens=16", "shard.count=2",
                                  f"shard.index={k}", output=tmp_path / f"s{k}" / "f.h5"))
              for k in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    with probe.open(single) as one, probe.open(merged) as many:
        assert sorted(many.index) == list(one.index)
        for row, window in enumerate(many.index):
            assert many["file"].asstr()[row] == one["file"].asstr()[int(window)]
            for key in keys:
                np.testing.assert_allclose(many.rows_of(key, row=row),
                                           one.rows_of(key, int(window)), rtol=1e-6, atol=0,
                                           err_msg=key)


def test_a_folder_of_csv_stories_in_order_of_their_names(make_cfg, tiny_lm, tmp_path, lm):
    _, tokenizer, _ = lm
    folder = tmp_path / "stories"
    folder.mkdir()
    # no offset column: it is optional; "text" (the column's default) is absent, so: word
    _write(folder / "b.csv", [(w, n) for n, w in enumerate(WORDS[:5])], ("word", "onset"))
    _write(folder / "a.csv", [(w, n) for n, w in enumerate(WORDS[5:])], ("word", "onset"))
    path = probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                              f"dataset.path={folder}", f"layers=[{LAYER}]",
                              "dataset.context_tokens=32"))
    a, b = (tokenizer(" ".join(w))["input_ids"] for w in (WORDS[5:], WORDS[:5]))
    with probe.open(path) as f:
        files = list(f["file"].asstr()[:])
        assert files == ["a.csv"] * len(_windows(len(a), 32, 16)) + ["b.csv"]
        np.testing.assert_array_equal(f["input_ids"][:], a + b)
        assert f.attrs["offset_column"] == "" and f.attrs["stories"] == 2


def test_which_paths_are_stories(tiny_lm, story, tmp_path):
    """A .tsv, or a .csv whose header has the onset column; an ordinary csv is a corpus."""
    from probe.data.text.corpus import TextDataset
    from probe.data.text.words import WordStories

    corpus = _write(tmp_path / "docs.csv", [("a cat sat", 0)], ("text", "label"))
    timed = _write(tmp_path / "timed.csv", [("cat", 0.5)], ("text", "start"))
    assert type(TextDataset(path=str(story), tokenizer=str(tiny_lm))) is WordStories
    assert type(TextDataset(path=str(corpus), tokenizer=str(tiny_lm))) is TextDataset
    assert type(TextDataset(path=str(timed), tokenizer=str(tiny_lm))) is TextDataset
    assert type(TextDataset(path=str(timed), tokenizer=str(tiny_lm),
                            onset_column="start")) is WordStories


def test_the_config_knows_the_keys(make_cfg):
    cfg = make_cfg("dataset=text")
    assert cfg.dataset.context_tokens is None and cfg.dataset.context_stride is None
    assert cfg.dataset.onset_column == "onset" and cfg.dataset.offset_column == "offset"
    with pytest.raises(Exception, match="context_tokens"):
        make_cfg("dataset=text", "dataset.context_tokens=many")


def test_a_changed_story_is_not_resumed(words_cfg, tmp_path):
    story = _story(tmp_path / "story.tsv")
    overrides = ("dataset.context_tokens=16", f"dataset.path={story}")
    probe.run(words_cfg(*overrides, output=tmp_path / "f.h5"))
    text = story.read_text()  # an offset changed in place: the same size, other bytes
    story.write_text(text[:-2] + str(int(text[-2]) ^ 1) + text[-1:])
    assert len(story.read_text()) == len(text) and story.read_text() != text
    with pytest.raises(OutputError, match=r"^the dataset changed since .* \(stories: \w+ "
                                          r"then, \w+ now\)") as info:
        probe.run(words_cfg(*overrides, output=tmp_path / "f.h5"))
    assert "\n" not in str(info.value)


def _table(tmp_path, name: str, rows, header=("word", "onset", "offset")) -> str:
    return f"dataset.path={_write(tmp_path / name, rows, header)}"


_GOOD = [("the", 0.0, 0.2), ("cat", 0.3, 0.5), ("sat", 0.6, 0.8)]


@pytest.mark.parametrize("case, error, message", [
    ("no onset column", ConfigError,
     r"dataset.onset_column='onset' is not a column of '.*story.tsv'; it has word, start, end"),
    ("a csv corpus asked for windows", ConfigError,
     r"dataset.context_tokens=16 is for word-timed stories, and '.*docs.csv' has no onset "
     r"column 'onset' \(it has text, label\)"),
    ("a jsonl corpus asked for windows", ConfigError,
     r"dataset.context_stride=4 is for word-timed stories, and dataset.path='.*docs.jsonl' is "
     "no word table"),
    ("a missing onset", DataError, r"story.tsv', line 3: its onset is missing"),
    ("a NaN onset", DataError, r"story.tsv', line 3: its onset is missing"),
    ("onsets going backwards", DataError,
     r"story.tsv', line 4: onset 0.1 is before the previous word's 0.3 \(line 3\)"),
    ("an offset before its onset", DataError,
     r"story.tsv', line 3: offset 0.1 is before its onset 0.3"),
    ("a header alone", DataError, r"story.tsv' holds no words \(a header alone\)"),
    ("an empty file", DataError, r"story.tsv' is empty"),
    ("a stride beyond the window", ConfigError,
     r"dataset.context_stride=9 must be between 1 and dataset.context_tokens=8"),
    ("a stride of 0", ConfigError, r"dataset.context_stride=0 must be between 1 and"),
    ("a window beyond the positions", ConfigError,
     r"^dataset sample 0 has 200 tokens, beyond the 128 positions of GPT2LMHeadModel \(\d+ of "
     r"\d+ are\); set dataset.context_tokens=128 \(or less\)"),
    ("packing a story", ConfigError,
     r"dataset.packing=True does not apply to a word-timed story"),
])
def test_bad_stories_are_one_line_and_no_file(words_cfg, tmp_path, case, error, message):
    def story(*rows, header=("word", "onset", "offset")) -> str:
        return _table(tmp_path, "story.tsv", rows, header)

    made = {  # each case's overrides, made when it runs (the tables share a name)
        "no onset column": lambda: [story(*_GOOD, header=("word", "start", "end"))],
        "a csv corpus asked for windows": lambda: [
            _table(tmp_path, "docs.csv", [("a cat", 1)], ("text", "label")),
            "dataset.context_tokens=16"],
        "a jsonl corpus asked for windows": lambda: [
            f"dataset.path={_jsonl(tmp_path / 'docs.jsonl')}", "dataset.context_stride=4"],
        "a missing onset": lambda: [story(_GOOD[0], ("cat", "", 0.5))],
        "a NaN onset": lambda: [story(_GOOD[0], ("cat", "nan", 0.5))],
        "onsets going backwards": lambda: [story(_GOOD[0], _GOOD[1], ("sat", 0.1, 0.2))],
        "an offset before its onset": lambda: [story(_GOOD[0], ("cat", 0.3, 0.1), _GOOD[2])],
        "a header alone": lambda: [story()],
        "an empty file": lambda: [_empty(tmp_path / "story.tsv")],
        "a stride beyond the window": lambda: ["dataset.context_tokens=8",
                                               "dataset.context_stride=9"],
        "a stride of 0": lambda: ["dataset.context_stride=0"],
        "a window beyond the positions": lambda: [
            story(*[(WORDS[n % len(WORDS)], n, n + 0.5) for n in range(200)]),
            "dataset.context_tokens=200"],
        "packing a story": lambda: ["dataset.packing=true"],
    }
    overrides = made[case]()
    with pytest.raises(error, match=message) as info:
        probe.run(words_cfg(*overrides))
    assert "\n" not in str(info.value)
    assert no_h5_files(tmp_path)


def _jsonl(path):
    from tests.tiny_text import write_jsonl

    return write_jsonl(path, ["a cat sat"])


def _empty(path):
    path.write_text("")
    return f"dataset.path={path}"


def test_an_ordinary_csv_corpus_is_read_as_before(make_cfg, tiny_lm, tmp_path):
    docs = _write(tmp_path / "docs.csv", [("the cat sat", 0), ("a dog ran", 1)],
                  ("text", "label"))
    path = probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                              f"dataset.path={docs}", f"layers=[{LAYER}]",
                              "dataset.label_column=label"))
    with h5py.File(path, "r") as f:
        assert f["target"][:].tolist() == [0, 1] and "onset" not in f and "file" not in f
        assert "context_tokens" not in f.attrs and f.attrs["max_length"] == 128
