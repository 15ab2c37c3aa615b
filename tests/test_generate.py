"""Generation: a language model answers each prompt with its own generate(), and the file holds
the prompt's and the answer's rows. Every stored row equals the layer's output in one forward
pass over prompt + answer, sample by sample, and each greedy token is that forward's argmax;
end tokens stop a sample; sampling is seeded; resume, shards and the listing know the rows that
generation adds. A 2-block GPT-2, 32 wide, with a tokenizer trained here; no downloads."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError
from probe.file.merge import merge
from tests.cli import cli
from tests.conftest import assert_same_datasets, interrupt_after, no_h5_files
from tests.tiny_text import documents, write_jsonl

pytest.importorskip("transformers")

# prompts of 2 to 12 words (about 8 to 50 tokens): batches mix lengths
PROMPTS = documents(9, seed=5, low=2, high=12)
NEW = 6
LAYERS = "layers=[transformer.h.0,transformer.h.1,lm_head]"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", PROMPTS)


@pytest.fixture
def gen_cfg(make_cfg, tiny_lm, prompts):
    def make(*overrides: str, output=None, model=None):
        return make_cfg("model=transformers", f"model.name={model or tiny_lm}", "dataset=text",
                        f"dataset.path={prompts}", "batch_size=4",
                        f"generate.max_new_tokens={NEW}", *overrides, output=output)
    return make


@pytest.fixture(scope="module")
def model(tiny_lm):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_lm).eval()


def _samples(path, *keys):
    """Each sample's rows of ``keys`` (and its ids and generated flags), by the offsets."""
    with h5py.File(path) as f:
        bounds = f["offsets"][:]
        columns = {key: f[key][:] for key in ("input_ids", "generated", *keys)}
        answers = [text.decode() for text in f["completion"][:]]
    return [{key: value[a:b] for key, value in columns.items()} | {"completion": answers[n]}
            for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]


def _forward_alone(model, ids):
    """Hidden states and logits of one teacher-forced forward over ``ids`` alone."""
    with torch.no_grad():
        out = model(torch.tensor(ids, dtype=torch.long)[None], output_hidden_states=True,
                    use_cache=False)
    return [h[0].numpy() for h in out.hidden_states], out.logits[0].numpy()


def test_rows_equal_one_forward_over_prompt_and_answer(gen_cfg, model, tiny_lm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    path = probe.run(gen_cfg(LAYERS))
    samples = _samples(path, "transformer.h.0/output", "transformer.h.1/output",
                       "lm_head/output")
    assert len(samples) == len(PROMPTS)
    lengths = set()
    for text, sample in zip(PROMPTS, samples, strict=True):
        prompt = tokenizer(text)["input_ids"]
        lengths.add(len(prompt))
        ids, generated = sample["input_ids"], sample["generated"]
        # the prompt's rows, then every new token's (no end token here: all NEW of them)
        assert ids[:len(prompt)].tolist() == prompt
        assert generated.tolist() == [False] * len(prompt) + [True] * NEW
        hidden, logits = _forward_alone(model, ids)
        np.testing.assert_allclose(sample["transformer.h.0/output"], hidden[1], atol=1e-4)
        np.testing.assert_allclose(sample["lm_head/output"], logits, atol=1e-4)
        # greedy: each new token is the argmax after the one before it
        assert (logits[len(prompt) - 1:-1].argmax(1) == ids[len(prompt):]).all()
        assert sample["completion"] == tokenizer.decode(ids[len(prompt):],
                                                        skip_special_tokens=True)
    assert len(lengths) > 3  # the batches mixed prompts of different lengths


def test_block_outputs_equal_the_forward_including_the_last_block(gen_cfg, model):
    # hidden_states[-1] comes after the final norm: the last block's own output is hooked
    # on a copy of the model instead
    path = probe.run(gen_cfg("layers=[transformer.h.1]"))
    outputs = {}
    handle = model.transformer.h[1].register_forward_hook(
        lambda m, a, out: outputs.__setitem__("h1", out[0] if isinstance(out, tuple) else out))
    try:
        for sample in _samples(path, "transformer.h.1/output"):
            _forward_alone(model, sample["input_ids"])
            np.testing.assert_allclose(sample["transformer.h.1/output"],
                                       outputs["h1"][0].numpy(), atol=1e-4)
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def stopping_lm(tiny_lm, model, tmp_path_factory):
    """The tiny model whose generation config names, as its end token, the third token that
    greedy decoding gives the first prompt: that sample stops there, others may not."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_lm)(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=3, do_sample=False,
                                pad_token_id=0)[0, ids.shape[1]:]
    folder = tmp_path_factory.mktemp("stopping") / "lm"
    shutil.copytree(tiny_lm, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = int(answer[2])
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder, int(answer[2])


def test_an_end_token_stops_its_sample_and_is_its_last_row(gen_cfg, stopping_lm, model,
                                                           tmp_path):
    folder, end = stopping_lm
    samples = _samples(probe.run(gen_cfg("layers=[transformer.h.0]", model=folder)),
                       "transformer.h.0/output")
    counts = [int(s["generated"].sum()) for s in samples]
    assert counts[0] <= 3 and samples[0]["input_ids"][-1] == end
    for sample, count in zip(samples, counts, strict=True):
        new = sample["input_ids"][sample["generated"]]
        # nothing after the first end token; without one, all NEW tokens
        assert (list(new).index(end) + 1 == count) if end in new else count == NEW
        hidden, _ = _forward_alone(model, sample["input_ids"])
        np.testing.assert_allclose(sample["transformer.h.0/output"], hidden[1], atol=1e-4)
    # and with generate.stop_at_eos=false, every sample has NEW new tokens
    kept = _samples(probe.run(gen_cfg("layers=[transformer.h.0]", "generate.stop_at_eos=false",
                                      model=folder, output=tmp_path / "kept.h5")))
    assert all(int(s["generated"].sum()) == NEW for s in kept)


def test_seeded_sampling_is_reproducible_and_the_seed_matters(gen_cfg, tmp_path):
    sampled = ("layers=[transformer.h.0]", "generate.do_sample=true", "generate.temperature=2.0")
    first = probe.run(gen_cfg(*sampled, output=tmp_path / "a.h5"))
    again = probe.run(gen_cfg(*sampled, output=tmp_path / "b.h5"))
    other = probe.run(gen_cfg(*sampled, "seed=1", output=tmp_path / "c.h5"))
    assert_same_datasets(first, again, ("input_ids", "offsets", "transformer.h.0/output"))
    with h5py.File(first) as a, h5py.File(other) as c:
        assert list(a["completion"][:]) != list(c["completion"][:])
    greedy = _samples(probe.run(gen_cfg("layers=[transformer.h.0]", output=tmp_path / "g.h5")))
    assert [s["completion"] for s in greedy] != [s["completion"] for s in _samples(first)]


@pytest.mark.parametrize("rows", ["prompt", "answer"])
def test_generate_rows_keeps_the_prompt_or_the_answer(gen_cfg, rows, tmp_path):
    every = _samples(probe.run(gen_cfg("layers=[transformer.h.0]", output=tmp_path / "all.h5")),
                     "transformer.h.0/output")
    part = _samples(probe.run(gen_cfg("layers=[transformer.h.0]", f"generate.rows={rows}",
                                      output=tmp_path / "part.h5")), "transformer.h.0/output")
    for whole, some in zip(every, part, strict=True):
        chosen = whole["generated"] if rows == "answer" else ~whole["generated"]
        np.testing.assert_array_equal(some["transformer.h.0/output"],
                                      whole["transformer.h.0/output"][chosen])
        assert some["completion"] == whole["completion"]
    # pooled: tokens=mean over the answer's rows alone, tokens=last at the prompt's last
    pooled = {"answer": "mean", "prompt": "last"}[rows]
    with h5py.File(probe.run(gen_cfg("layers=[transformer.h.0]", f"generate.rows={rows}",
                                     f"tokens={pooled}", output=tmp_path / "pooled.h5"))) as f:
        values = f["transformer.h.0/output"][:]
    for n, some in enumerate(part):
        rows_of = some["transformer.h.0/output"]
        expected = rows_of.mean(0) if pooled == "mean" else rows_of[-1]
        np.testing.assert_allclose(values[n], expected, atol=1e-6)


def test_an_interrupted_run_resumes_to_the_same_file(make_cfg, tiny_lm, tmp_path, monkeypatch):
    docs = write_jsonl(tmp_path / "docs.jsonl", documents(40, seed=3, low=2, high=10))
    overrides = ("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                 f"dataset.path={docs}", "layers=[transformer.h.0]", "batch_size=2",
                 "output.commit_every=1", "generate.max_new_tokens=4", "generate.do_sample=true")
    whole = probe.run(make_cfg(*overrides, output=tmp_path / "whole.h5"))
    interrupt_after(monkeypatch, 18)  # past the first group of 16 batches of 2
    with pytest.raises(KeyboardInterrupt):
        probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    with probe.open(tmp_path / "resumed.h5", allow_partial=True) as f:
        assert 0 < f.num_rows < 40
    probe.run(make_cfg(*overrides, output=tmp_path / "resumed.h5"))
    assert_same_datasets(whole, tmp_path / "resumed.h5",
                         ("index", "offsets", "input_ids", "positions", "generated",
                          "completion", "transformer.h.0/output"))


def test_shards_merge_into_the_unsharded_run(gen_cfg, tmp_path):
    single = probe.run(gen_cfg("layers=[transformer.h.0]", output=tmp_path / "single.h5"))
    shards = [probe.run(gen_cfg("layers=[transformer.h.0]", "shard.count=2", f"shard.index={k}",
                                output=tmp_path / f"s{k}" / "f.h5")) for k in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    by_index = {}
    with h5py.File(merged) as f:
        index = f["index"][:]
    for n, sample in zip(index, _samples(merged, "transformer.h.0/output"), strict=True):
        by_index[int(n)] = sample
    for n, sample in enumerate(_samples(single, "transformer.h.0/output")):
        other = by_index[n]
        assert other["completion"] == sample["completion"]
        np.testing.assert_array_equal(other["generated"], sample["generated"])
        np.testing.assert_allclose(other["transformer.h.0/output"],
                                   sample["transformer.h.0/output"], atol=1e-5)


def test_the_plan_counts_the_rows_generation_may_add(gen_cfg, caplog):
    from transformers import AutoTokenizer

    cfg = gen_cfg("layers=[transformer.h.0]")
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    prompt_tokens = sum(len(tokenizer(text)["input_ids"]) for text in PROMPTS)
    with caplog.at_level("INFO"):
        plan = probe.plan(cfg)
    assert plan.num_positions is None  # end tokens may stop samples early
    said = " ".join(record.getMessage() for record in caplog.records)
    assert f"at most {prompt_tokens + NEW * len(PROMPTS)} positions" in said, said
    assert f"generate: up to {NEW} new tokens per prompt" in said


def test_the_layer_listing_says_how_many_rows_a_sample_can_have(gen_cfg):
    from probe.pipeline.listing import layer_table

    notes, rows = layer_table(gen_cfg())
    assert any(f"up to {NEW} generated tokens" in note for note in notes), notes
    assert {row[0]: row for row in rows}["transformer.h.0"][3] == "128 B"


@pytest.mark.parametrize("overrides, message", [
    (("hooks=[forward,backward]",), "gradients are not taken while a model generates"),
    (("generate.temperature=0.5",), "generate.temperature=0.5 shapes sampling, which is off"),
    (("generate.do_sample=true", "generate.top_p=1.5"), "generate.top_p=1.5 must be in (0, 1]"),
    (("generate.max_new_tokens=-1",), "generate.max_new_tokens=-1 must be 0"),
    (("generate.max_new_tokens=200",), "beyond the 128 positions of GPT2LMHeadModel"),
    (("model.head=base", "layers=[h.0]"), "has no language-model head to generate with"),
    (("dataset.packing=true", "dataset.max_length=16"), "set dataset.packing=false"),
])
def test_what_generation_cannot_do_is_one_line_and_no_file(gen_cfg, tmp_path, overrides,
                                                          message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.").replace("[", r"\[")):
        probe.run(gen_cfg("layers=[transformer.h.0]", *overrides))
    assert no_h5_files(tmp_path)


def test_a_prompt_too_long_for_its_answer_is_refused_in_the_plan(make_cfg, tiny_lm, tmp_path):
    docs = write_jsonl(tmp_path / "long.jsonl", documents(3, seed=2, low=40, high=40))
    cfg = make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                   f"dataset.path={docs}", "dataset.max_length=128", "layers=[transformer.h.0]",
                   "generate.max_new_tokens=16")
    with pytest.raises(ConfigError, match="beyond the 112 positions of GPT2LMHeadModel less "
                                          r"generate\.max_new_tokens=16.*dataset\.max_length=112"):
        probe.run(cfg)
    assert no_h5_files(tmp_path)


def test_an_image_model_that_cannot_generate_says_so(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="does not generate text"):
        probe.run(make_cfg("layers=[features.0]", "generate.max_new_tokens=4"))
    assert no_h5_files(tmp_path)


def test_the_cli_from_another_directory(tiny_lm, prompts, tmp_path):
    out = tmp_path / "deep" / "path with spaces" / "answers.h5"
    done = cli("model=transformers", f"model.name={tiny_lm}", "dataset=text",
               f"dataset.path={prompts}", "layers=[transformer.h.0]",
               f"generate.max_new_tokens={NEW}", f"output.path={out}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with probe.open(out) as f:
        assert f["generated"][:].sum() == NEW * len(PROMPTS)
    refused = cli("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                  f"dataset.path={prompts}", "layers=[transformer.h.0]", "hooks=[backward]",
                  f"generate.max_new_tokens={NEW}", f"output.path={tmp_path / 'no.h5'}",
                  cwd=tmp_path)
    assert refused.returncode != 0
    assert "gradients are not taken while a model generates" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_gradients_of_the_answer_through_its_token_ids(gen_cfg, make_cfg, tiny_lm, tmp_path):
    """The recipe for gradients (docs/generate.md): the generating run's ids and offsets as a
    dataset=tokens corpus, read with hooks=[backward] objective=nll: its rows are the same
    tokens, and its forward values the generating run's."""
    answered = probe.run(gen_cfg("layers=[transformer.h.0]", output=tmp_path / "answers.h5"))
    with probe.open(answered) as f:
        np.save(tmp_path / "ids.npy", f["input_ids"][:])
        np.save(tmp_path / "offsets.npy", f.offsets[:])
    graded = probe.run(make_cfg(
        "model=transformers", f"model.name={tiny_lm}", "dataset=tokens",
        f"dataset.path={tmp_path / 'ids.npy'}", f"dataset.offsets={tmp_path / 'offsets.npy'}",
        "layers=[transformer.h.0]", "hooks=[forward,backward]", "objective=nll",
        output=tmp_path / "graded.h5"))
    with probe.open(answered) as a, probe.open(graded) as g:
        np.testing.assert_array_equal(a.offsets[:], g.offsets[:])
        np.testing.assert_array_equal(a["input_ids"][:], g["input_ids"][:])
        np.testing.assert_allclose(g["transformer.h.0/output"][:],
                                   a["transformer.h.0/output"][:], atol=1e-4)
        assert np.abs(g["transformer.h.0/grad_output"][:]).sum() > 0


def test_token_id_prompts_answer_as_text_prompts_do(gen_cfg, make_cfg, tiny_lm, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    ids = tmp_path / "prompts.jsonl"
    ids.write_text("".join(json.dumps({"input_ids": tokenizer(text)["input_ids"]}) + "\n"
                           for text in PROMPTS))
    from_text = _samples(probe.run(gen_cfg("layers=[transformer.h.0]",
                                           output=tmp_path / "text.h5")),
                         "transformer.h.0/output")
    from_ids = _samples(probe.run(make_cfg(
        "model=transformers", f"model.name={tiny_lm}", "dataset=tokens", f"dataset.path={ids}",
        "layers=[transformer.h.0]", "batch_size=4", f"generate.max_new_tokens={NEW}",
        output=tmp_path / "ids.h5")), "transformer.h.0/output")
    for a, b in zip(from_text, from_ids, strict=True):
        assert a["completion"] == b["completion"]
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        np.testing.assert_allclose(a["transformer.h.0/output"], b["transformer.h.0/output"],
                                   atol=1e-6)


@pytest.mark.process
def test_torchrun_ranks_merge_into_the_one_process_run(gen_cfg, tiny_lm, prompts, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    single = _samples(probe.run(gen_cfg("layers=[transformer.h.0]",
                                        output=tmp_path / "single.h5")),
                      "transformer.h.0/output")
    out = tmp_path / "ranks" / "answers.h5"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "probe",
         "model=transformers", f"model.name={tiny_lm}", "dataset=text",
         f"dataset.path={prompts}", "layers=[transformer.h.0]", "batch_size=4",
         f"generate.max_new_tokens={NEW}", f"output.path={out}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    with h5py.File(out) as f:
        index = f["index"][:].tolist()
    merged = dict(zip(index, _samples(out, "transformer.h.0/output"), strict=True))
    assert sorted(merged) == list(range(len(PROMPTS)))
    for n, sample in enumerate(single):
        assert merged[n]["completion"] == sample["completion"]
        np.testing.assert_array_equal(merged[n]["input_ids"], sample["input_ids"])
        np.testing.assert_allclose(merged[n]["transformer.h.0/output"],
                                   sample["transformer.h.0/output"], atol=1e-5)
