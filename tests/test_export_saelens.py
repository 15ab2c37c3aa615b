"""python -m probe.export to=saelens: a datasets folder in the layout of SAELens' activation cache
(CacheActivationsRunner's features, save_to_disk's files), its rows the file's windows in a
seeded permutation applied out of core, and SAELens' own ActivationsStore reading it."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import probe
from probe.errors import ConfigError
from probe.file.exports import export
from tests.conftest import compose_cfg
from tests.test_export import image_file, token_file

datasets = pytest.importorskip("datasets")

CONTEXT = 16
LAYERS = ("transformer.h.0", "transformer.h.1")


@pytest.fixture(scope="module")
def packed(tiny_lm, tmp_path_factory) -> Path:
    """A real packed run of the tiny GPT-2: windows of 16 tokens, two blocks' outputs."""
    from tests.tiny_text import documents, write_jsonl

    folder = tmp_path_factory.mktemp("packed")
    corpus = write_jsonl(folder / "docs.jsonl", documents(20, seed=5))
    cfg = compose_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                      f"dataset.path={corpus}", "dataset.packing=true",
                      f"dataset.max_length={CONTEXT}", f"layers=[{','.join(LAYERS)}]",
                      "batch_size=8", output=folder / "packed.h5")
    return probe.run(cfg)


def _column(loaded, name: str) -> np.ndarray:
    return np.asarray(loaded.with_format("numpy")[:][name])


def _windows(path: Path, key: str):
    with probe.open(path) as f:
        offsets, rows, ids = f.offsets, f[key][:], f["input_ids"][:]
    full = np.flatnonzero(np.diff(offsets) == CONTEXT)
    return full, {int(w): (rows[offsets[w]:offsets[w + 1]], ids[offsets[w]:offsets[w + 1]])
                  for w in full}


def test_the_folder_is_saelens_cache_layout(packed):
    # as sae_lens/cache_activations_runner.py declares its features and consolidates shards
    from datasets import Array2D, Features, Sequence, Value

    done = export(packed, "saelens")
    out = packed.with_name("packed_export")
    assert sorted(p.name for p in out.iterdir()) == ["data-00000-of-00001.arrow",
                                                     "dataset_info.json", "state.json"]
    assert [w.path.name for w in done.files][0] == "data-00000-of-00001.arrow"
    loaded = datasets.load_from_disk(str(out))
    with probe.open(packed) as f:
        width = f[f"{LAYERS[0]}/output"].shape[1]
    runner = Features({**{layer: Array2D(shape=(CONTEXT, width), dtype="float32")
                          for layer in LAYERS},
                       "token_ids": Sequence(Value(dtype="int32"), length=CONTEXT)})
    for name, feature in runner.items():
        assert loaded.features[name] == feature, name
    assert loaded.features["index"] == Value("int64")
    assert loaded.column_names == [*LAYERS, "token_ids", "index"]


def test_rows_are_the_windows_in_the_seeded_order(packed, tmp_path):
    full, windows = _windows(packed, f"{LAYERS[1]}/output")
    export(packed, "saelens", seed=3, out_dir=tmp_path / "a", memory_mb=0.01)
    loaded = datasets.load_from_disk(str(tmp_path / "a")).with_format("numpy")
    order = _column(loaded, "index")
    np.testing.assert_array_equal(order, full[np.random.default_rng(3).permutation(len(full))])
    assert sorted(order.tolist()) == full.tolist() and not np.array_equal(order, full)
    for row in (0, len(order) // 2, len(order) - 1):
        acts, ids = windows[int(order[row])]
        np.testing.assert_array_equal(loaded[row][LAYERS[1]], acts)  # exactly
        np.testing.assert_array_equal(loaded[row]["token_ids"], ids)
    export(packed, "saelens", seed=None, out_dir=tmp_path / "b")
    np.testing.assert_array_equal(_column(datasets.load_from_disk(str(tmp_path / "b")), "index"),
                                  full)


def test_passes_and_shards_give_the_in_memory_permutation(monkeypatch, tmp_path):
    from probe.file.exports import saelens

    path = token_file(tmp_path / "t.h5", windows=40, context=8, widths=(4, 3))
    export(path, "saelens", seed=1, out_dir=tmp_path / "one", memory_mb=64)
    monkeypatch.setattr(saelens, "_SHARD_BYTES", 1000)  # shards of a few windows each
    export(path, "saelens", seed=1, out_dir=tmp_path / "many", memory_mb=0.001)
    assert len(list((tmp_path / "many").glob("data-*-of-*.arrow"))) > 3
    one = datasets.load_from_disk(str(tmp_path / "one"))
    many = datasets.load_from_disk(str(tmp_path / "many"))
    with probe.open(path) as f:
        rows, offsets = f["block.0/output"][:], f.offsets
    order = np.random.default_rng(1).permutation(39)  # the 40th window is short
    for name in ("index", "block.0", "block.1", "token_ids"):
        np.testing.assert_array_equal(_column(many, name), _column(one, name), err_msg=name)
    np.testing.assert_array_equal(_column(many, "index"), order)
    in_memory = rows[:39 * 8].reshape(39, 8, 4)[order]
    np.testing.assert_array_equal(_column(many, "block.0"), in_memory)
    assert offsets[-1] == 39 * 8 + 3


def test_a_short_last_window_is_left_out_and_logged(tmp_path, caplog):
    path = token_file(tmp_path / "t.h5", windows=5, context=8, last=3)
    with caplog.at_level(logging.WARNING, logger="probe"):
        done = export(path, "saelens")
    assert "left out window 4" in caplog.text and "3 of 8 tokens" in caplog.text
    assert done.notes and len(datasets.load_from_disk(str(tmp_path / "t_export"))) == 4
    whole = token_file(tmp_path / "w.h5", windows=5, context=8, last=None)
    assert not export(whole, "saelens").notes


def test_names_and_bfloat16(tmp_path):
    path = token_file(tmp_path / "t.h5", dtype="bfloat16")
    export(path, "saelens", names={"block.0": "blocks.0.hook_resid_post",
                                   "block.1/output": "blocks.1.hook_resid_post"})
    loaded = datasets.load_from_disk(str(tmp_path / "t_export")).with_format("numpy")
    assert loaded.column_names == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                                   "token_ids", "index"]
    assert loaded.features["blocks.0.hook_resid_post"].dtype == "float32"
    with probe.open(path) as f:
        first = f["block.0/output"][:]
    w = int(_column(loaded, "index")[0])
    np.testing.assert_array_equal(loaded["blocks.0.hook_resid_post"][0],
                                  first[w * 8:(w + 1) * 8])


@pytest.mark.parametrize("make, call, match", [
    (lambda p: image_file(p), {}, r"needs a packed text run \(dataset.packing=true\), and "
                                  r".* is not a text run"),
    (lambda p: token_file(p, attrs={"packing": False}), {}, "is dataset.packing=false"),
    (lambda p: token_file(p, lengths=[8, 7, 8, 6], attrs={"exclude_special": True}), {},
     "2 of 4 windows .* another length .dataset.exclude_special=true"),
    (lambda p: token_file(p, per_sample_key=True), {"keys": ["pooled"]},
     r"a vector per token.*pooled/output \(9, 5\)"),
    (lambda p: token_file(p), {"names": {"block.7": "x"}}, "names= maps 'block.7', which is not"),
    (lambda p: token_file(p), {"names": {"block.0": "same", "block.1": "same"}},
     "two columns named 'same'"),
    (lambda p: token_file(p), {"names": {"block.0": "index"}}, "two columns named 'index'"),
])
def test_refusals(make, call, match, tmp_path):
    path = make(tmp_path / "f.h5")
    with pytest.raises(ConfigError, match=match):
        export(path, "saelens", **call)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.h5"]


def test_a_per_sample_key_is_left_out_unless_asked(tmp_path):
    path = token_file(tmp_path / "t.h5", per_sample_key=True)
    export(path, "saelens")
    assert datasets.load_from_disk(str(tmp_path / "t_export")).column_names == [
        "block.0", "block.1", "token_ids", "index"]


def test_saelens_reads_the_folder_through_its_cached_activations_path(packed, tmp_path):
    # SAELens' ActivationsStore, as its trainer builds it from a cache; sae-lens is in the
    # test extra, so this is skipped only where it could not be installed
    pytest.importorskip("sae_lens", reason="pip install 'probe[saelens]'")
    import torch
    from sae_lens.training.activations_store import ActivationsStore

    export(packed, "saelens", seed=0, out_dir=tmp_path / "cache",
           names={LAYERS[1]: "blocks.1.hook_resid_post"})
    full, windows = _windows(packed, f"{LAYERS[1]}/output")
    width = windows[int(full[0])][0].shape[1]
    store = ActivationsStore(
        model=None, dataset=None, streaming=False, hook_name="blocks.1.hook_resid_post",
        hook_head_index=None, context_size=CONTEXT, d_in=width, n_batches_in_buffer=2,
        total_training_tokens=CONTEXT * len(full), store_batch_size_prompts=4,
        train_batch_size_tokens=32, prepend_bos=False, normalize_activations="none",
        device=torch.device("cpu"), dtype="float32",
        cached_activations_path=str(tmp_path / "cache"))
    acts, ids = store.get_raw_llm_batch()
    order = full[np.random.default_rng(0).permutation(len(full))][:4]
    np.testing.assert_array_equal(acts.numpy(), np.concatenate([windows[int(w)][0]
                                                                for w in order]))
    np.testing.assert_array_equal(ids.numpy(), np.concatenate([windows[int(w)][1]
                                                               for w in order]))
    batch = next(iter(store))  # its trainer's mixing buffer, over the cache
    assert batch.shape == (32, width)


def test_the_command_takes_names_as_a_mapping(tmp_path):
    from tests.conftest import cli, error_line

    path = token_file(tmp_path / "t.h5")
    done = cli(f"file={path}", "to=saelens", "names={block.0:blocks.0.hook_resid_post}",
               "seed=null", cwd=tmp_path, module="probe.export")
    assert done.returncode == 0, done.stderr
    assert "data-00000-of-00001.arrow  8 rows" in done.stdout  # the 9th window is short
    loaded = datasets.load_from_disk(str(tmp_path / "t_export"))
    assert loaded.column_names[0] == "blocks.0.hook_resid_post"
    np.testing.assert_array_equal(_column(loaded, "index"), np.arange(8))
    assert "names=3 is not a mapping" in error_line(
        cli(f"file={path}", "to=saelens", "names=3", "out_dir=x", cwd=tmp_path,
            module="probe.export"))


def test_a_corpus_shorter_than_a_window_is_refused(tmp_path):
    path = token_file(tmp_path / "t.h5", lengths=[5])
    with pytest.raises(ConfigError, match="found no window of dataset.max_length=8"):
        export(path, "saelens")


def test_the_shuffle_holds_a_pass_at_a_time(tmp_path):
    # 32 MiB of token rows, shuffled with 0.5 MiB at once: numpy's buffers are traced
    import tracemalloc

    path = token_file(tmp_path / "t.h5", windows=1024, context=8, widths=(1024,), last=None,
                      batch=256)
    tracemalloc.start()
    try:
        export(path, "saelens", memory_mb=0.5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB"

