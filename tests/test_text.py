"""Language models: every stored token row equals what the model computes for that document
alone, gradients are each sample's own, and the file format, resume, shards and reading work for
rows per token. A 2-block GPT-2, 32 wide, with a tokenizer trained here; no downloads."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from probe.file.merge import merge
from tests.conftest import (
    assert_same_datasets,
    compose_cfg,
    interrupt_after,
    no_h5_files,
    run_with,
)
from tests.tiny_text import documents, write_jsonl

pytest.importorskip("transformers")

DOCS = documents(11, seed=1, high=20)  # up to about 60 tokens: none is truncated


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "docs.jsonl", DOCS,
                       labels=[n % 3 for n in range(len(DOCS))])


@pytest.fixture
def text_cfg(make_cfg, tiny_lm, corpus):
    def make(*overrides: str, output=None):
        return make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                        f"dataset.path={corpus}", "batch_size=4", *overrides, output=output)
    return make


def _reference(tiny_lm):
    """The model and tokenizer loaded by transformers alone, and each document's hidden states
    from a forward pass of that document by itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    states = []
    with torch.no_grad():
        for text in DOCS:
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            states.append([h[0].numpy() for h in model(ids, output_hidden_states=True,
                                                        use_cache=False).hidden_states])
    return model, tokenizer, states


@pytest.fixture(scope="module")
def reference(tiny_lm):
    return _reference(tiny_lm)


def test_every_token_row_equals_the_document_alone(text_cfg, reference, tiny_lm):
    # block 0's input is hidden_states[0] and its output hidden_states[1] (block 1's is not
    # in hidden_states: the last entry comes after the final norm, which ln_f's output is)
    path = probe.run(text_cfg("layers=[transformer.h.0,transformer.h.1,transformer.ln_f]",
                              "hooks=[forward,forward_pre]"))
    _, tokenizer, states = reference
    with probe.open(path) as f:
        offsets, ids = f.offsets, f["input_ids"][:]
        assert len(offsets) == len(DOCS) + 1 and offsets[-1] == len(ids)
        assert f.attrs["tokens"] == "all" and f.attrs["tokenizer"] == str(tiny_lm)
        for i, text in enumerate(DOCS):
            rows = slice(offsets[i], offsets[i + 1])
            np.testing.assert_array_equal(ids[rows], tokenizer(text)["input_ids"])
            np.testing.assert_array_equal(f["positions"][rows], np.arange(rows.stop - rows.start))
            for key, want in (("transformer.h.0/input", states[i][0]),
                              ("transformer.h.0/output", states[i][1]),
                              ("transformer.h.1/input", states[i][1]),
                              ("transformer.ln_f/output", states[i][2])):
                np.testing.assert_allclose(f[key][rows], want, rtol=1e-5, atol=1e-5,
                                           err_msg=f"{key} of document {i}")
            np.testing.assert_array_equal(f.rows_of("transformer.h.0/output", i),
                                          f["transformer.h.0/output"][rows])
        assert f["transformer.h.0/output"].attrs["rows"] == "token"


@pytest.mark.parametrize("tokens", ["first", "last", "mean"])
def test_one_row_per_sample(text_cfg, reference, tokens, tmp_path):
    path = probe.run(text_cfg("layers=[transformer.h.0]", f"tokens={tokens}",
                              output=tmp_path / f"{tokens}.h5"))
    pool = {"first": lambda h: h[0], "last": lambda h: h[-1], "mean": lambda h: h.mean(0)}
    with probe.open(path) as f:
        stored = f["transformer.h.0/output"][:]
        assert stored.shape == (len(DOCS), 32) and "rows" not in f["transformer.h.0/output"].attrs
        assert len(f["input_ids"]) == f.offsets[-1]  # every token's id is still there
    want = np.stack([pool[tokens](states[1]) for states in reference[2]])
    np.testing.assert_allclose(stored, want, rtol=1e-5, atol=1e-5)


def test_batch_size_does_not_change_the_file(text_cfg, tmp_path):
    files = [probe.run(text_cfg("layers=[transformer.h.1]", f"batch_size={size}",
                                output=tmp_path / f"b{size}.h5")) for size in (1, 7)]
    with h5py.File(files[0], "r") as one, h5py.File(files[1], "r") as seven:
        for key in ("index", "offsets", "input_ids", "positions"):
            np.testing.assert_array_equal(one[key][:], seven[key][:])
        np.testing.assert_allclose(one["transformer.h.1/output"][:],
                                   seven["transformer.h.1/output"][:], rtol=1e-5, atol=1e-5)


def test_bucketed_batches_give_the_same_file(text_cfg, tmp_path):
    keys = ("index", "offsets", "input_ids", "positions", "transformer.h.1/output")
    files = {name: probe.run(text_cfg("layers=[transformer.h.1]", "batch_size=2", *extra,
                                      output=tmp_path / f"{name}.h5"))
             for name, extra in (("plain", ["bucket_by_length=false"]), ("bucketed", []),
                                 ("budget", ["batch_tokens=70"]))}
    with h5py.File(files["plain"], "r") as plain:
        for name in ("bucketed", "budget"):
            with h5py.File(files[name], "r") as other:
                for key in keys[:-1]:
                    np.testing.assert_array_equal(other[key][:], plain[key][:], err_msg=key)
                np.testing.assert_allclose(other[keys[-1]][:], plain[keys[-1]][:], rtol=1e-5,
                                           atol=1e-5)


def test_batch_plans_cover_every_sample_once_by_length_and_budget():
    from probe.data.buckets import plan_batches
    from probe.data.feed import Batching

    lengths = np.random.default_rng(0).integers(1, 100, 50)
    for batching in (Batching(4), Batching(4, bucket=True), Batching(4, 150),
                     Batching(4, 150, bucket=True)):
        planned = plan_batches(lengths, batching)
        joined = np.concatenate([positions for positions, _ in planned])
        assert sorted(joined.tolist()) == list(range(50))
        ends = [n for n, (_, end) in enumerate(planned) if end]
        windows = [np.concatenate([p for p, _ in planned[a + 1:b + 1]])
                   for a, b in zip([-1, *ends], ends, strict=False)]
        for window in windows:  # a window holds consecutive samples
            assert window.max() - window.min() == len(window) - 1
            if batching.bucket:
                assert (np.diff(lengths[window]) >= 0).all()
        for positions, _ in planned:
            if batching.batch_tokens and len(positions) > 1:
                assert lengths[positions].max() * len(positions) <= batching.batch_tokens
            if not batching.batch_tokens:
                assert len(positions) <= 4


def test_nll_gradients_are_each_documents_own(text_cfg, reference):
    model, tokenizer, _ = reference
    path = probe.run(text_cfg("layers=[transformer.h.0]", "hooks=[backward,backward_input]",
                              "objective=nll"))
    with probe.open(path) as f:
        offsets = f.offsets
        grads = f["transformer.h.0/grad_output"][:]
        grads_in = f["transformer.h.0/grad_input"][:]
        assert f.attrs["objective"] == "nll"
    block = model.transformer.h[0]
    for i, text in enumerate(DOCS):
        seen: dict[str, torch.Tensor] = {}
        handles = [block.register_forward_pre_hook(lambda m, a, s=seen: s.update(a=a[0])),
                   block.register_forward_hook(lambda m, a, out, s=seen: s.update(out=out))]
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        logits = model(ids, use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
        want_out, want_in = torch.autograd.grad(loss, [seen["out"], seen["a"]])
        for handle in handles:
            handle.remove()
        rows = slice(offsets[i], offsets[i + 1])
        scale = float(want_out.abs().max())
        assert scale > 0
        np.testing.assert_allclose(grads[rows], want_out[0].numpy(), rtol=1e-4, atol=1e-6 * scale)
        np.testing.assert_allclose(grads_in[rows], want_in[0].numpy(), rtol=1e-4,
                                   atol=1e-6 * float(want_in.abs().max()))


def test_packing_fills_windows_and_records_documents(text_cfg, reference):
    path = probe.run(text_cfg("layers=[transformer.h.0]", "dataset.packing=true",
                              "dataset.max_length=16", "dataset.exclude_special=true"))
    model, tokenizer, _ = reference
    stream, documents = [], []
    for n, text in enumerate(DOCS):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        stream += ids
        documents += [n] * len(ids)
    with probe.open(path) as f:
        windows = f.num_rows
        assert windows == -(-len(stream) // 16) and f.attrs["packing"]
        kept = [t != tokenizer.eos_token_id for t in stream]  # the separators are left out
        np.testing.assert_array_equal(f["input_ids"][:], np.array(stream)[kept])
        np.testing.assert_array_equal(f["document"][:], np.array(documents)[kept])
        assert set(np.diff(f["positions"][:]).tolist()) <= {1, 2, -15, -14}  # gaps: separators
        for w in (0, windows - 1):
            window = torch.tensor([stream[16 * w:16 * (w + 1)]])
            with torch.no_grad():
                hidden = model(window, output_hidden_states=True).hidden_states[1][0].numpy()
            keep = np.array(kept[16 * w:16 * (w + 1)])
            np.testing.assert_allclose(f.rows_of("transformer.h.0/output", w), hidden[keep],
                                       rtol=1e-5, atol=1e-5)


def _interrupt_and_resume(make_cfg, tmp_path, monkeypatch, *overrides: str) -> tuple:
    """A run of 60 documents in batches of 2, and the same run interrupted after 20 batches
    then run again; the partial file's state in between."""
    whole = probe.run(make_cfg(*overrides, output=tmp_path / "whole.h5"))
    interrupt_after(monkeypatch, 20)
    with pytest.raises(KeyboardInterrupt):
        probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    with probe.open(tmp_path / "resumed.h5", allow_partial=True) as f:
        partial = (f.num_rows, int(f.attrs["num_samples"]))
    probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    assert_same_datasets(whole, tmp_path / "resumed.h5", ("index", "offsets", "input_ids",
                                                         "positions", "transformer.h.0/output"))
    return partial


def _sixty(tiny_lm, tmp_path, seed: int) -> list[str]:
    docs = write_jsonl(tmp_path / "docs.jsonl", documents(60, seed=seed, high=20))
    return ["model=transformers", f"model.name={tiny_lm}", "dataset=text",
            f"dataset.path={docs}", "layers=[transformer.h.0]", "batch_size=2",
            "output.commit_every=1"]


def test_interrupted_bucketed_run_resumes_to_the_same_file(make_cfg, tiny_lm, tmp_path,
                                                           monkeypatch):
    # windows of 16 batches of 2: a window is written once complete, and a resume starts at a
    # window's start, so the batches, and the bytes, are the same; with lzf, token rows also
    # wait for their chunk, so the commit counts whole samples only
    rows, _ = _interrupt_and_resume(make_cfg, tmp_path, monkeypatch,
                                    *_sixty(tiny_lm, tmp_path, 2), "output.compression=lzf")
    assert 0 < rows < 60


def test_shards_merge_into_one_run(text_cfg, tmp_path):
    single = probe.run(text_cfg("layers=[transformer.h.0]", output=tmp_path / "single.h5"))
    shards = [probe.run(text_cfg("layers=[transformer.h.0]", "shard.count=3",
                                 f"shard.index={k}", output=tmp_path / f"s{k}" / "f.h5"))
              for k in range(3)]
    merged = merge(tmp_path / "merged.h5", shards)
    _assert_same_documents(merged, single)
    with probe.open(merged) as many:
        assert many["transformer.h.0/output"].is_virtual


def test_nested_shards_merge_into_one_run(text_cfg, tmp_path):
    """torchrun on two nodes: each node's two ranks (a 4-way split) merge into the node's file,
    shard c of 2 (node 1's copied, so its rows are in its ranks' order); then the nodes'
    files merge into the whole run."""
    from probe.pipeline.shards import nested_shard

    single = probe.run(text_cfg("layers=[transformer.h.0]", output=tmp_path / "single.h5"))
    nodes = []
    for c in range(2):
        ranks = []
        for r in range(2):
            index, count = nested_shard(c, 2, r, 2)
            ranks.append(probe.run(text_cfg("layers=[transformer.h.0]", f"shard.index={index}",
                                            f"shard.count={count}",
                                            output=tmp_path / f"n{c}" / f"{r}.h5")))
        nodes.append(merge(tmp_path / f"n{c}" / "f.h5", ranks, into=(c, 2), copy=c == 1))
    _assert_same_documents(merge(tmp_path / "merged.h5", nodes), single)


def _assert_same_documents(merged, single) -> None:
    with probe.open(single) as one, probe.open(merged) as many:
        assert many.attrs["merged_order"] == "shards"
        assert sorted(many.index) == list(one.index)
        for row, sample in enumerate(many.index):  # every sample's rows, wherever they are
            np.testing.assert_allclose(many.rows_of("transformer.h.0/output", row=row),
                                       one.rows_of("transformer.h.0/output", int(sample)),
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(many.rows_of("input_ids", row=row),
                                          one.rows_of("input_ids", int(sample)))
            # by its dataset index, a sample's rows are the same wherever they lie
            np.testing.assert_array_equal(many.rows_of("input_ids", int(sample)),
                                          one.rows_of("input_ids", int(sample)))
        with pytest.raises(KeyError, match="dataset index 99 is not in"):
            many.rows_of("input_ids", 99)


def test_reading_token_rows_shuffled_and_probing_the_last_token(text_cfg, tmp_path):
    path = probe.run(text_cfg("layers=[transformer.h.1]", "dataset.label_column=label",
                              output=tmp_path / "all.h5"))
    with probe.open(path) as f:
        total, offsets, labels = int(f.offsets[-1]), f.offsets, f.target
        seen = [(x, y) for x, y in f.loader("transformer.h.1/output", batch_size=64,
                                            shuffle=True, seed=0)]
        x = torch.cat([x for x, _ in seen])
        y = torch.cat([y for _, y in seen])
        assert len(x) == total and not torch.equal(x, torch.from_numpy(
            f["transformer.h.1/output"][:]))
        # each row keeps its document's label
        per_token = np.repeat(labels, np.diff(offsets))
        order = [int(np.flatnonzero((f["transformer.h.1/output"][:] == row.numpy()).all(1))[0])
                 for row in x[:20]]
        np.testing.assert_array_equal(y[:20].numpy(), per_token[order])
    with pytest.raises(ConfigError, match="one row per token.*tokens=last"):
        from probe.analyses.fit import fit_probes

        fit_probes(path)
    last = probe.run(text_cfg("layers=[transformer.h.1]", "dataset.label_column=label",
                              "tokens=last", output=tmp_path / "last.h5"))
    from probe.analyses.fit import fit_probes

    (result,) = fit_probes(last, epochs=2, test_fraction=0.3)
    assert result["n_test"] == 3 and 0 <= result["accuracy"] <= 1


def test_bfloat16_storage_reads_back_exactly(text_cfg, tmp_path):
    full = probe.run(text_cfg("layers=[transformer.h.0]", output=tmp_path / "f32.h5"))
    half = probe.run(text_cfg("layers=[transformer.h.0]", "output.dtype=bfloat16",
                              output=tmp_path / "bf16.h5"))
    with h5py.File(half, "r") as raw:  # plain h5py: the raw bits, and the attr that says so
        assert raw["transformer.h.0/output"].dtype == np.uint16
        assert raw["transformer.h.0/output"].attrs["dtype"] == "bfloat16"
    with probe.open(full) as a, probe.open(half) as b:
        want = torch.from_numpy(a["transformer.h.0/output"][:]).bfloat16().float().numpy()
        np.testing.assert_array_equal(b["transformer.h.0/output"][:], want)
        x, _ = next(iter(b.loader("transformer.h.0/output", batch_size=8)))
        assert x.dtype == torch.float32


def test_float16_overflow_is_an_error_not_infinities(make_cfg, tmp_path):
    loud = torch.nn.Sequential(torch.nn.Linear(3 * 32 * 32, 4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        loud[0].weight.fill_(1000.0)
    model = torch.nn.Sequential(torch.nn.Flatten(), loud)
    cfg = make_cfg("model=custom", "model._target_=tests.tiny.TinyNet", "layers=[1.0]",
                   "output.dtype=float16")
    with pytest.raises(ConfigError, match="beyond float16's range"):
        run_with(cfg, model=model)
    assert no_h5_files(tmp_path)


@pytest.mark.parametrize("overrides, error, message", [
    (["layers=[transformer.h.0]", "dataset.column=body"], ConfigError,
     "dataset.column='body' is not a column of .*docs.jsonl; it has text, label"),
    (["layers=[transformer.h.0]", "dataset.path=/nope/docs.jsonl"], DataError,
     "dataset.path='/nope/docs.jsonl': no such file"),
    (["layers=[transformer.h.9]"], ConfigError, "Closest: transformer.h.1, transformer.h.0"),
    (["layers=[transformer.h.0]", "hooks=[backward]", "objective=target",
      "dataset.label_column=label"], ConfigError, "objective=target needs model.head="
                                                  "sequence_classification"),
    (["layers=[transformer.h.0]", "hooks=[backward]", "objective=nll", "model.head=base"],
     ConfigError, "objective=nll needs model.head=causal_lm, but the model has no head"),
    (["layers=[transformer.h.0]", "hooks=[backward]", "model.head=sequence_classification",
      "objective=target"], ConfigError, "objective=target but the dataset has no targets"),
    (["layers=[transformer.h.0]", "model.name=gpt2-nowhere"], DataError,
     "neither a folder nor in the Hugging Face cache.*huggingface-cli download"),
    (["layers=[transformer.h.0]", "dataset.label_column=text"], ConfigError,
     "holds <U.* values; it must hold integer class numbers"),
])
def test_bad_text_input_is_one_line_and_no_file(text_cfg, tmp_path, overrides, error, message):
    with pytest.raises(error, match=message) as info:
        probe.run(text_cfg(*overrides))
    assert "\n" not in str(info.value)
    assert no_h5_files(tmp_path)


def test_a_document_beyond_the_models_positions_is_refused_in_the_plan(text_cfg, tmp_path):
    """Not by the model mid-run (the dry run reads the first document only): every length is
    known before the run; a corpus read as it comes must be cut within the positions."""
    from tests.tiny_text import WORDS

    docs = write_jsonl(tmp_path / "long.jsonl", ["a short one", " ".join(WORDS * 40)])
    with pytest.raises(ConfigError, match=r"^dataset sample 1 has \d+ tokens, beyond the 128 "
                                          r"positions of GPT2LMHeadModel \(1 of 2 are\); set "
                                          r"dataset.max_length=128 \(or less\) to cut them$"):
        probe.run(text_cfg("layers=[transformer.h.0]", f"dataset.path={docs}",
                           "dataset.max_length=1000000"))
    with pytest.raises(ConfigError, match=r"^dataset.max_length=1000000 is beyond the 128 "
                                          r"positions of GPT2LMHeadModel, and a corpus read as"):
        probe.run(text_cfg("layers=[transformer.h.0]", "dataset.streaming=true",
                           "dataset.max_length=1000000"))
    assert no_h5_files(tmp_path)


def test_the_repr_of_a_file_of_token_rows_counts_samples_and_rows(text_cfg):
    with probe.open(probe.run(text_cfg("layers=[transformer.h.0]"))) as f:
        assert f.num_rows == len(DOCS)
        assert (f"{len(DOCS)} samples, {int(f.offsets[-1])} position rows, complete"
                in repr(f)), repr(f)


def test_the_layer_listing_is_per_token(text_cfg):
    from probe.pipeline.listing import layer_table

    rows = {row[0]: row for row in layer_table(text_cfg())[1]}
    assert rows["name"][3] == "bytes/tok"
    assert rows["transformer.h.0"][2] == "(32,)" and rows["transformer.h.0"][3] == "128 B"
    assert rows["lm_head"][2] == f"({rows['lm_head'][2].strip('(,)')},)"


@pytest.mark.slow
def test_sigkill_then_resume_a_text_run(tiny_lm, tmp_path):
    import os
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    docs = write_jsonl(tmp_path / "many.jsonl", documents(3000, seed=5, high=20))
    args = ["model=transformers", f"model.name={tiny_lm}", "dataset=text",
            f"dataset.path={docs}", "layers=[transformer.h.1]", "batch_size=8",
            "output.commit_every=1", "output.compression=lzf", f"output.path={tmp_path}/f.h5"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for attempt in range(3):
        process = subprocess.Popen([sys.executable, "-m", "probe", *args], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if attempt < 2:
            while not (tmp_path / "f.h5.partial").exists() and process.poll() is None:
                time.sleep(0.05)
            time.sleep(1.0 + attempt)
            process.kill()
        _, stderr = process.communicate(timeout=1800)
    assert process.returncode == 0, stderr
    whole = probe.run(compose_cfg(*args[:-1], output=tmp_path / "whole.h5", tiny=False))
    assert_same_datasets(tmp_path / "f.h5", whole, ("index", "offsets", "input_ids",
                                                   "transformer.h.1/output"))


@pytest.mark.parametrize("extra", [[], ["limit=9", "shard.count=2", "shard.index=1"],
                                   ["dataset.packing=true", "dataset.max_length=16"]])
def test_a_streamed_corpus_gives_the_same_rows(text_cfg, tmp_path, extra):
    keys = ["index", "offsets", "input_ids", "positions", "transformer.h.0/output"]
    if extra and "dataset.packing=true" in extra:
        keys.append("document")
    read = probe.run(text_cfg("layers=[transformer.h.0]", *extra, output=tmp_path / "read.h5"))
    streamed = probe.run(text_cfg("layers=[transformer.h.0]", "dataset.streaming=true", *extra,
                                  output=tmp_path / "streamed.h5"))
    with h5py.File(read, "r") as a, h5py.File(streamed, "r") as b:
        assert b.attrs["streaming"] and b.attrs["num_samples"] == a.attrs["num_samples"]
        for key in keys:
            np.testing.assert_allclose(b[key][:], a[key][:], rtol=1e-5, atol=1e-5, err_msg=key)


def test_an_interrupted_stream_resumes_to_the_same_file(make_cfg, tiny_lm, tmp_path,
                                                        monkeypatch):
    rows, total = _interrupt_and_resume(make_cfg, tmp_path, monkeypatch,
                                        *_sixty(tiny_lm, tmp_path, 3), "dataset.streaming=true")
    assert 0 < rows < 60 and total == -1  # a stream's length is not known until it ends
    with probe.open(tmp_path / "resumed.h5") as f:
        assert f.num_rows == 60


def test_device_maps_equal_the_plain_run(text_cfg, tmp_path):
    # on this machine every device is the CPU; a GPU node spreads the same map over its GPUs
    pytest.importorskip("accelerate")
    plain = probe.run(text_cfg("layers=[transformer.h.1]", output=tmp_path / "plain.h5"))
    # block 1 offloaded to disk: accelerate places the model and loads the block as it runs
    places = {"transformer.wte": "cpu", "transformer.wpe": "cpu", "transformer.drop": "cpu",
              "transformer.h.0": "cpu", "transformer.h.1": "disk", "transformer.ln_f": "cpu",
              "lm_head": "cpu"}
    offload = ["model.device_map={" + ",".join(f"{k}:{v}" for k, v in places.items()) + "}",
               f"model.offload_folder={tmp_path / 'offload'}"]
    for name, extra in (("auto", ["model.device_map=auto"]), ("offload", offload)):
        mapped = probe.run(text_cfg("layers=[transformer.h.1]", *extra,
                                    output=tmp_path / f"{name}.h5"))
        assert_same_datasets(plain, mapped, ("index", "offsets", "transformer.h.1/output"))
    with pytest.raises(ConfigError, match="leave device=auto"):
        probe.run(text_cfg("layers=[transformer.h.1]", "device=cpu", *offload,
                           output=tmp_path / "refused.h5"))
