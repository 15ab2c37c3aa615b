"""Interventions while capturing (+intervene=<name>): each stored row equals the same model
changed by a hook written here, by hand, run on each sample alone without probe (zero and mean
ablation, heads of a GPT-2 and of a Llama, steering at every generated token, patching from a
second file, gradients through a change); patching a run with its own rows changes nothing, bit
for bit; the file records the interventions, a changed vector is never resumed into, a killed
run resumes to the same file; every mistake is one line. Tiny models made here."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import probe
from probe.errors import ConfigError, OutputError, RunStopped
from tests.cli import cli
from tests.conftest import assert_same_datasets, interrupt_after, no_h5_files
from tests.tiny_text import documents, write_jsonl

transformers = pytest.importorskip("transformers")

DOCS = documents(6, seed=4, low=2, high=12)  # lengths differ: every batch is padded
NEW = 4  # new tokens of the generating runs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("interventions") / "docs.jsonl", DOCS)


@pytest.fixture(scope="module")
def model(tiny_lm):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_lm).eval()


@pytest.fixture(scope="module")
def tiny_llama(tiny_lm, tmp_path_factory):
    """A 2-block Llama, 4 query heads sharing 2 key/value heads, with the GPT-2's tokenizer."""
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_lm)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32,
                                      intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128,
                                      eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_lm / name).exists():
            shutil.copy(tiny_lm / name, folder / name)
    return folder


def _cfg(make_cfg, lm, corpus, layers, items=None, *extra, output=None):
    cfg = make_cfg("model=transformers", f"model.name={lm}", "dataset=text",
                   f"dataset.path={corpus}", f"layers=[{layers}]", "batch_size=4", *extra,
                   output=output)
    if items is not None:
        cfg.intervene = OmegaConf.create(items)
    return cfg


def _rows(path, key):
    """Each sample's rows of ``key`` (and its token ids), by the offsets."""
    with h5py.File(path) as f:
        bounds, values, ids = f["offsets"][:], f[key][:], f["input_ids"][:]
    return [(values[a:b], ids[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _alone(model, ids, layer: str, hooks=()) -> np.ndarray:
    """``layer``'s output on ``ids`` alone (no padding), with ``hooks`` = [(module, kind,
    function)] registered for the call."""
    modules, seen = dict(model.named_modules()), {}
    handles = [modules[layer].register_forward_hook(
        lambda m, a, out: seen.setdefault("v", out[0] if isinstance(out, tuple) else out))]
    for name, kind, function in hooks:
        register = (modules[name].register_forward_pre_hook if kind == "pre" else
                    modules[name].register_forward_hook)
        handles.insert(0, register(function))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids, dtype=torch.long)[None])
    finally:
        for handle in handles:
            handle.remove()
    return seen["v"][0].numpy()


def _replaced(function):
    """A forward hook whose output (or first item) is ``function(output)``."""
    def hook(module, args, out):
        if isinstance(out, tuple):
            return (function(out[0]), *out[1:])
        return function(out)
    return hook


# -- a patch with the run's own rows is no change ----------------------------------------------

def test_patching_every_position_with_the_runs_own_rows_changes_nothing_bit_for_bit(
        make_cfg, tiny_lm, corpus, tmp_path):
    layers = "transformer.h.0,transformer.h.1,lm_head"
    plain = probe.run(_cfg(make_cfg, tiny_lm, corpus, layers, output=tmp_path / "plain.h5"))
    patched = probe.run(_cfg(make_cfg, tiny_lm, corpus, layers,
                             [{"at": "transformer.h.0", "do": "patch", "from": str(plain)}],
                             output=tmp_path / "patched.h5"))
    with h5py.File(plain) as a, h5py.File(patched) as b:
        for key in ("transformer.h.0/output", "transformer.h.1/output", "lm_head/output"):
            assert a[key].dtype == np.float32
            np.testing.assert_array_equal(a[key][:], b[key][:], err_msg=key)
        assert "interventions" not in a.attrs
        said = json.loads(b.attrs["interventions"])
        assert said[0]["do"] == "patch" and said[0]["from"] == str(plain)


# -- ablations against hand-written hooks ------------------------------------------------------

def test_zero_and_mean_ablation_equal_a_hand_written_hook(make_cfg, tiny_lm, corpus, model,
                                                          tmp_path):
    # block 0's attention runs before its MLP: stored unchanged; the MLP stores its new output
    layers = "transformer.h.0.attn,transformer.h.0.mlp,transformer.h.1"
    source = probe.run(_cfg(make_cfg, tiny_lm, corpus, layers, output=tmp_path / "source.h5"))
    with h5py.File(source) as f:
        mean = torch.from_numpy(f["transformer.h.0.mlp/output"][:].astype(np.float64)
                                .mean(0).astype(np.float32))
    for do, function in (("zero", torch.zeros_like), ("mean", lambda x: mean.expand_as(x))):
        item = {"at": "transformer.h.0.mlp", "do": do}
        if do == "mean":
            item["from"] = str(source)
        path = probe.run(_cfg(make_cfg, tiny_lm, corpus, layers, [item],
                              output=tmp_path / f"{do}.h5"))
        for rows, ids in _rows(path, "transformer.h.1/output"):
            expected = _alone(model, ids, "transformer.h.1",
                              [("transformer.h.0.mlp", "forward", _replaced(function))])
            np.testing.assert_allclose(rows, expected, atol=1e-5, err_msg=do)
        with h5py.File(source) as a, h5py.File(path) as b:
            np.testing.assert_array_equal(a["transformer.h.0.attn/output"][:],
                                          b["transformer.h.0.attn/output"][:])
            changed = b["transformer.h.0.mlp/output"][:]
            np.testing.assert_allclose(changed, function(torch.from_numpy(changed)).numpy(),
                                       atol=1e-7)


def test_listed_positions_count_back_from_the_end(make_cfg, tiny_lm, corpus, model, tmp_path):
    path = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                          [{"at": "transformer.h.0", "do": "zero", "positions": [0, -1]}]))

    def ends_zeroed(x):
        x = x.clone()
        x[:, [0, -1]] = 0
        return x

    for rows, ids in _rows(path, "transformer.h.1/output"):
        expected = _alone(model, ids, "transformer.h.1",
                          [("transformer.h.0", "forward", _replaced(ends_zeroed))])
        np.testing.assert_allclose(rows, expected, atol=1e-5)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_head_ablation_equals_zeroing_the_heads_slice_by_hand(architecture, make_cfg, tiny_lm,
                                                              tiny_llama, corpus, tmp_path):
    folder, attention, projection, heads, size, block = {
        "gpt2": (tiny_lm, "transformer.h.1.attn", "transformer.h.1.attn.c_proj", [1], 16,
                 "transformer.h.1"),
        "llama": (tiny_llama, "model.layers.1.self_attn", "model.layers.1.self_attn.o_proj",
                  [0, 3], 8, "model.layers.1")}[architecture]
    own = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    path = probe.run(_cfg(make_cfg, folder, corpus, block,
                          [{"at": attention, "do": "heads", "heads": heads}]))

    def zeroed(module, args):
        x = args[0].clone()
        for head in heads:
            x[..., head * size:(head + 1) * size] = 0
        return (x, *args[1:])

    for rows, ids in _rows(path, f"{block}/output"):
        expected = _alone(own, ids, block, [(projection, "pre", zeroed)])
        plain = _alone(own, ids, block)
        np.testing.assert_allclose(rows, expected, atol=1e-5)
        assert not np.allclose(rows, plain, atol=1e-4)  # the heads did matter


# -- steering at every generated token ----------------------------------------------------------

@pytest.mark.parametrize("positions", ["all", "answer"])
def test_steering_applies_at_every_generated_token(positions, make_cfg, tiny_lm, corpus, model,
                                                   tmp_path, caplog):
    vector = np.random.default_rng(0).normal(size=32).astype(np.float32)
    np.save(tmp_path / "v.npy", vector)
    alpha = 3.0
    item = {"at": "transformer.h.0", "do": "add", "vector": str(tmp_path / "v.npy"),
            "alpha": alpha, "positions": positions}
    with caplog.at_level("INFO"):
        path = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", [item],
                              f"generate.max_new_tokens={NEW}", "generate.stop_at_eos=false"))
    steer = torch.from_numpy(vector) * alpha
    prompts = 0
    for rows, ids in _rows(path, "transformer.h.1/output"):
        prompt = len(ids) - NEW
        prompts += prompt

        def steered(x, prompt=prompt):
            keep = torch.arange(x.shape[1]) >= (prompt if positions == "answer" else 0)
            return x + steer * keep[None, :, None]

        hook = [("transformer.h.0", "forward", _replaced(steered))]
        sequence = list(ids[:prompt])
        for _ in range(NEW):  # a greedy loop without cache, the hook on at every step
            handles = [model.transformer.h[0].register_forward_hook(_replaced(steered))]
            with torch.no_grad():
                logits = model(torch.tensor([sequence])).logits
            handles[0].remove()
            sequence.append(int(logits[0, -1].argmax()))
        assert list(ids) == sequence
        np.testing.assert_allclose(rows, _alone(model, sequence, "transformer.h.1", hook),
                                   atol=1e-5)
    count = prompts + NEW * len(DOCS) if positions == "all" else NEW * len(DOCS)
    assert f"add at transformer.h.0: {count}" in caplog.text


# -- patching from a second file -----------------------------------------------------------------

def test_patching_the_last_position_from_a_corrupted_run_equals_the_manual_patch(
        make_cfg, tiny_lm, model, tmp_path):
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 12, size=5)
    clean = [rng.integers(5, 150, size=n).tolist() for n in lengths]
    corrupted = [rng.integers(5, 150, size=n).tolist() for n in lengths]  # the same lengths
    for name, rows in (("clean", clean), ("corrupted", corrupted)):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"input_ids": r}) + "\n" for r in rows))

    def cfg(name, items=None):
        c = make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=tokens",
                     f"dataset.path={tmp_path / name}.jsonl",
                     "layers=[transformer.h.0,transformer.h.1]", "batch_size=2",
                     output=tmp_path / f"{name}-{bool(items)}.h5")
        if items:
            c.intervene = OmegaConf.create(items)
        return c

    source = probe.run(cfg("corrupted"))
    path = probe.run(cfg("clean", [{"at": "transformer.h.0", "do": "patch", "from": str(source),
                                    "positions": "last"}]))
    for (rows, ids), (source_rows, _) in zip(_rows(path, "transformer.h.1/output"),
                                              _rows(source, "transformer.h.0/output"),
                                              strict=True):
        row = torch.from_numpy(source_rows[-1])

        def last_patched(x, row=row):
            x = x.clone()
            x[:, -1] = row
            return x

        expected = _alone(model, ids, "transformer.h.1",
                          [("transformer.h.0", "forward", _replaced(last_patched))])
        np.testing.assert_allclose(rows, expected, atol=1e-5)


# -- gradients through a change ------------------------------------------------------------------

def test_gradients_flow_through_the_intervened_forward(make_cfg, tiny_lm, corpus, model):
    path = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.0",
                          [{"at": "transformer.h.1.mlp", "do": "scale", "alpha": 0.5}],
                          "hooks=[backward]", "objective=nll"))
    with h5py.File(path) as f:
        bounds, grads, all_ids = f["offsets"][:], f["transformer.h.0/grad_output"][:], \
            f["input_ids"][:]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        ids = torch.as_tensor(all_ids[a:b], dtype=torch.long)[None]
        seen = {}

        def keep(module, args, out, seen=seen):
            seen["h0"] = out[0] if isinstance(out, tuple) else out

        handles = [model.transformer.h[1].mlp.register_forward_hook(lambda m, i, o: o * 0.5),
                   model.transformer.h[0].register_forward_hook(keep)]
        embeds = model.transformer.wte(ids).detach().requires_grad_()
        logits = model(inputs_embeds=embeds).logits
        for handle in handles:
            handle.remove()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        expected, = torch.autograd.grad(loss, seen["h0"])
        np.testing.assert_allclose(grads[a:b], expected[0].numpy(), atol=1e-6)


# -- recorded, never resumed into, resumed after a kill -------------------------------------------

def test_a_changed_vector_is_never_resumed_into(make_cfg, tiny_lm, corpus, tmp_path):
    np.save(tmp_path / "v.npy", np.ones(32, np.float32))
    items = [{"at": "transformer.h.0", "do": "add", "vector": str(tmp_path / "v.npy")}]
    path = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items))
    with h5py.File(path) as f:
        said = json.loads(f.attrs["interventions"])[0]
        assert said["shape"] == [32] and said["vector"] == str(tmp_path / "v.npy")
        assert "intervention_fingerprint" in f.attrs
    probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items))  # the same: done
    np.save(tmp_path / "v.npy", np.full(32, 2, np.float32))
    with pytest.raises(OutputError, match="the interventions changed .* vectors, means or "
                                          "source files differ"):
        probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items))


def test_a_killed_intervened_run_resumes_to_the_uninterrupted_file(make_cfg, tiny_lm, corpus,
                                                                   tmp_path, monkeypatch):
    items = [{"at": "transformer.h.0.attn", "do": "heads", "heads": [0]}]
    whole = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items, "batch_size=2",
                           output=tmp_path / "whole.h5"))
    cfg = _cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items, "batch_size=2",
               "output.commit_every=1", output=tmp_path / "killed.h5")
    interrupt_after(monkeypatch, 1)
    with pytest.raises((RunStopped, KeyboardInterrupt)):
        probe.run(cfg)
    resumed = probe.run(cfg)
    assert_same_datasets(whole, resumed, ["transformer.h.1/output", "input_ids", "offsets"])


# -- one line for each mistake -------------------------------------------------------------------

@pytest.mark.parametrize("item, said", [
    ({"at": "transformer.h.9", "do": "zero"}, "has no module 'transformer.h.9'"),
    ({"at": "transformer.h.0", "do": "shift"}, "do='shift' is unknown"),
    ({"at": "transformer.h.0", "do": "zero", "alpha": 2}, "do: zero takes no 'alpha'"),
    ({"at": "transformer.h.0", "do": "add"}, "do: add needs vector"),
    ({"at": "transformer.h.0.attn", "do": "heads", "heads": [5]},
     "head 5 is beyond the 2 heads of 'transformer.h.0.attn' (0 to 1)"),
    ({"at": "transformer.h.0.mlp.act", "do": "heads", "heads": [0]},
     "(NewGELUActivation) has no projection that joins heads"),
    ({"at": "transformer.h.0", "do": "zero", "positions": [60]}, "positions=[60] lies beyond"),
    ({"at": "transformer.h.0", "do": "zero", "positions": "answer"},
     "positions=answer changes generated tokens, and this run generates none"),
    ({"at": "transformer.h.0", "do": "zero", "positions": "middle"},
     "positions='middle' is not one"),
    ({"at": "transformer.h.0", "do": "add", "vector": "VECTOR16"},
     "the vector is (16,) but the module's rows are (32,)"),
    ({"at": "transformer.h.0", "do": "add", "vector": "missing.npy"}, "does not exist"),
    ({"at": "transformer", "do": "zero"}, "GPT2Model gives no tensor to change"),
])
def test_each_mistake_is_one_line_and_writes_nothing(item, said, make_cfg, tiny_lm, corpus,
                                                      tmp_path):
    np.save(tmp_path / "v16.npy", np.ones(16, np.float32))
    if item.get("vector") == "VECTOR16":
        item = {**item, "vector": str(tmp_path / "v16.npy")}
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as raised:
        probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", [item],
                       output=out / "features.h5"))
    message = str(raised.value)
    assert said in message and "\n" not in message and "intervene[0]" in message
    assert no_h5_files(out)


def test_patching_from_another_model_or_layer_is_one_line(make_cfg, tiny_lm, corpus, tmp_path):
    from tests.tiny_text import tiny_gpt2

    other = tiny_gpt2(tmp_path / "other-lm", seed=1)
    theirs = probe.run(_cfg(make_cfg, other, corpus, "transformer.h.0",
                            output=tmp_path / "theirs.h5"))
    ours = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                          output=tmp_path / "ours.h5"))
    for source, said in ((theirs, "was written by another model (its weights differ)"),
                         (ours, "holds no 'transformer.h.0/output' (it holds "
                                "transformer.h.1/output)")):
        with pytest.raises(ConfigError, match=None) as raised:
            probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                           [{"at": "transformer.h.0", "do": "patch", "from": str(source)}],
                           output=tmp_path / "out" / "features.h5"))
        assert said in str(raised.value)
    assert no_h5_files(tmp_path / "out")


# -- the command line: conditions as a sweep -----------------------------------------------------

def test_a_sweep_over_conditions_writes_aligned_files_and_lists_what_they_touch(
        tiny_lm, corpus, tmp_path):
    conf = tmp_path / "my_conf" / "intervene"
    conf.mkdir(parents=True)
    np.save(tmp_path / "honesty.npy", np.ones(32, np.float32))
    (conf / "steer.yaml").write_text(
        "- {at: transformer.h.0, do: add, vector: honesty.npy, alpha: 2.0}\n")
    (conf / "ablate.yaml").write_text("- {at: transformer.h.1.attn, do: heads, heads: [1]}\n")
    common = [f"--config-dir={tmp_path / 'my_conf'}", "model=transformers",
              f"model.name={tiny_lm}", "dataset=text", f"dataset.path={corpus}",
              "layers=[transformer.h.1]"]
    listed = cli(*common, "+intervene=steer", cwd=tmp_path, module="probe.layers",
                 HF_HUB_OFFLINE="1")
    assert listed.returncode == 0, listed.stderr
    assert "intervene[0] (add at transformer.h.0)" in listed.stdout
    swept = cli(common[0], "-m", *common[1:], "+intervene=none,steer,ablate", cwd=tmp_path,
                HF_HUB_OFFLINE="1")
    assert swept.returncode == 0, swept.stderr
    files = sorted((tmp_path / "outputs").rglob("features.h5"))
    assert len(files) == 3
    recorded = {}
    for path in files:
        with h5py.File(path) as f:
            recorded[path] = (f["index"][:], f.attrs.get("interventions"),
                              f["transformer.h.1/output"][:])
    indices, said, values = zip(*recorded.values(), strict=True)
    assert all(np.array_equal(indices[0], index) for index in indices)
    assert sorted(s is None for s in said) == [False, False, True]  # none records nothing
    assert not np.allclose(values[0], values[1]) and not np.allclose(values[1], values[2])


def test_heads_set_to_a_files_mean_and_a_vector_from_a_probe_file(make_cfg, tiny_lm, corpus,
                                                                  model, tmp_path):
    source = probe.run(_cfg(make_cfg, tiny_lm, corpus,
                            "transformer.h.0,transformer.h.1.attn.c_proj",
                            None, "hooks=[forward,forward_pre]", output=tmp_path / "source.h5"))
    with h5py.File(source) as f:
        inputs = f["transformer.h.1.attn.c_proj/input"][:].astype(np.float64).mean(0)
        outputs = f["transformer.h.0/output"][:].astype(np.float64).mean(0)
    inputs, outputs = (torch.from_numpy(v.astype(np.float32)) for v in (inputs, outputs))
    path = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", [
        {"at": "transformer.h.0", "do": "add", "vector": f"{source}:transformer.h.0/output",
         "alpha": -1.0},
        {"at": "transformer.h.1.attn", "do": "heads", "heads": [0], "from": str(source)}]))

    def head_to_mean(module, args):
        x = args[0].clone()
        x[..., :16] = inputs[:16]
        return (x, *args[1:])

    hooks = [("transformer.h.0", "forward", _replaced(lambda x: x - outputs)),
             ("transformer.h.1.attn.c_proj", "pre", head_to_mean)]
    for rows, ids in _rows(path, "transformer.h.1/output"):
        np.testing.assert_allclose(rows, _alone(model, ids, "transformer.h.1", hooks), atol=1e-5)


def test_the_shards_of_an_intervened_run_merge_into_the_whole_run(make_cfg, tiny_lm, corpus,
                                                                  tmp_path):
    from probe.file.merge import merge

    np.save(tmp_path / "v.npy", np.ones(32, np.float32))
    items = [{"at": "transformer.h.0", "do": "add", "vector": str(tmp_path / "v.npy")}]
    whole = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items,
                           output=tmp_path / "whole.h5"))
    shards = [probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items,
                             f"shard.index={i}", "shard.count=2",
                             output=tmp_path / f"shard{i}.h5")) for i in range(2)]
    merged = merge(tmp_path / "merged.h5", shards, copy=True)
    with h5py.File(whole) as a, h5py.File(merged) as b:
        assert a.attrs["interventions"] == b.attrs["interventions"]
    for (rows, ids), (merged_rows, merged_ids) in zip(  # the same samples, by their ids
            sorted(_rows(whole, "transformer.h.1/output"), key=lambda r: tuple(r[1])),
            sorted(_rows(merged, "transformer.h.1/output"), key=lambda r: tuple(r[1])),
            strict=True):  # batched otherwise: equal up to the order of sums
        assert np.array_equal(ids, merged_ids)
        np.testing.assert_allclose(rows, merged_rows, atol=1e-5)
    np.save(tmp_path / "v.npy", np.zeros(32, np.float32))  # one shard again, another vector
    shards[1].unlink()
    probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1", items, "shard.index=1",
                   "shard.count=2", output=tmp_path / "shard1.h5"))
    with pytest.raises(OutputError, match="the interventions' vectors, means or source files"):
        merge(tmp_path / "merged-again.h5", shards, copy=True)


def test_a_vision_models_map_is_changed_whole_and_token_positions_are_refused(make_cfg,
                                                                              tmp_path):
    from tests.conftest import run_with
    from tests.tiny import TinyNet

    torch.manual_seed(0)
    net = TinyNet().eval()
    common = ("model=custom", "model._target_=tests.tiny.TinyNet", "dataset.image_size=8",
              "dataset.num_samples=6", "batch_size=4", "layers=[features.3,fc]")
    plain = run_with(make_cfg(*common, output=tmp_path / "plain.h5"), model=net)
    cfg = make_cfg(*common, output=tmp_path / "scaled.h5")
    cfg.intervene = OmegaConf.create([{"at": "features.3", "do": "scale", "alpha": 0.5}])
    scaled = run_with(cfg, model=net)
    with h5py.File(plain) as a, h5py.File(scaled) as b:
        conv = torch.from_numpy(a["features.3/output"][:])
        with torch.no_grad():  # the ReLU after the conv, the pool and the head, by hand
            expected = net.fc(net.pool(torch.relu(conv * 0.5)).flatten(1))
        np.testing.assert_allclose(b["fc/output"][:], expected.numpy(), atol=1e-6)
        np.testing.assert_allclose(b["features.3/output"][:], conv.numpy() * 0.5, atol=1e-7)
    cfg.intervene = OmegaConf.create([{"at": "features.3", "do": "zero", "positions": "last"}])
    cfg.output.path = str(tmp_path / "refused" / "features.h5")
    with pytest.raises(ConfigError, match=r"positions=last needs token positions, and this "
                                          r"module's value, \(1, 16, 4, 4\), does not lie"):
        run_with(cfg, model=net)
    assert no_h5_files(tmp_path / "refused")


# -- the review's findings: each refused in one line, before any file ---------------------------

def _tiny(name: str):
    """A one-block model of ``name``'s family, 32 wide, 4 heads of 8 (GPT-2: 2 of 16)."""
    t, width = transformers, {"hidden_size": 32, "num_hidden_layers": 1,
                              "num_attention_heads": 4, "vocab_size": 50}
    return {"gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_embd=32, n_layer=1, n_head=2,
                                                           vocab_size=50)),
            "llama": lambda: t.LlamaForCausalLM(t.LlamaConfig(
                **width, intermediate_size=64, num_key_value_heads=2)),
            "bert": lambda: t.BertModel(t.BertConfig(**width, intermediate_size=64)),
            "bert-ffn-32": lambda: t.BertModel(t.BertConfig(**width, intermediate_size=32)),
            "neox": lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**width,
                                                                 intermediate_size=64)),
            "falcon": lambda: t.FalconForCausalLM(t.FalconConfig(**width)),
            "opt": lambda: t.OPTForCausalLM(t.OPTConfig(**width, ffn_dim=64,
                                                        word_embed_proj_dim=32))}[name]()


@pytest.mark.parametrize("family, attention, projection, count", [
    ("gpt2", "transformer.h.0.attn", "c_proj", 2),
    ("llama", "model.layers.0.self_attn", "o_proj", 4),
    ("bert", "encoder.layer.0.attention", "output.dense", 4),
    ("neox", "gpt_neox.layers.0.attention", "dense", 4),
    ("falcon", "transformer.h.0.self_attention", "dense", 4),
    ("opt", "model.decoder.layers.0.self_attn", "out_proj", 4),
])
def test_heads_are_joined_by_the_attention_modules_projection(family, attention, projection,
                                                              count):
    from probe.families.hf_heads import attention_heads

    assert attention_heads(_tiny(family), attention) == (f"{attention}.{projection}", count)


@pytest.mark.parametrize("family", ["bert", "bert-ffn-32"])  # the FFN as wide as the heads too
def test_heads_of_a_bert_block_are_refused_for_its_ffns_projection(family):
    from probe.families.hf_heads import attention_heads

    with pytest.raises(ConfigError) as raised:
        attention_heads(_tiny(family), "encoder.layer.0")
    message = str(raised.value)
    assert "output.dense does not join the heads" in message and "\n" not in message
    assert message.endswith("name encoder.layer.0.attention")


def test_patching_from_rows_that_are_not_every_position_from_0_is_refused(
        make_cfg, tiny_lm, corpus, tmp_path):
    generated = ("generate.max_new_tokens=3", "generate.stop_at_eos=false")
    answers = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.0", None, *generated,
                             "generate.rows=answer", output=tmp_path / "answers.h5"))
    prompts_and_answers = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.0", None,
                                         *generated, output=tmp_path / "both.h5"))
    for source, extra, said in (
            (answers, generated, "its rows are not every position from 0 (a run with "
                                 "generate.rows=answer"),
            (prompts_and_answers, (), "the source run generated tokens, and stored their rows "
                                      "after the prompt's; patch from a run without "
                                      "generate.max_new_tokens")):
        with pytest.raises(ConfigError) as raised:
            probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                           [{"at": "transformer.h.0", "do": "patch", "from": str(source),
                             "positions": "prompt"}], *extra,
                           output=tmp_path / "out" / "features.h5"))
        message = str(raised.value)
        assert said in message and "\n" not in message and "intervene[0]" in message
    assert no_h5_files(tmp_path / "out")


def test_patching_from_a_source_of_fewer_samples_is_refused_before_any_file(
        make_cfg, tiny_lm, corpus, tmp_path):
    source = probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.0", None, "limit=4",
                            output=tmp_path / "source.h5"))
    with pytest.raises(ConfigError, match=r"intervene\[0\] .* holds 4 samples and this run "
                                          r"takes 6; patch from a run over the same samples"):
        probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                       [{"at": "transformer.h.0", "do": "patch", "from": str(source)}],
                       "batch_size=2", "bucket_by_length=false", "output.commit_every=1",
                       output=tmp_path / "out" / "features.h5"))
    assert no_h5_files(tmp_path / "out")


def test_positions_at_a_head_that_computes_the_last_position_alone_say_so(
        make_cfg, tiny_lm, corpus, tmp_path):
    from probe.pipeline.interventions.apply import _on_input

    with pytest.raises(ConfigError) as raised:
        probe.run(_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1",
                       [{"at": "lm_head", "do": "scale", "alpha": 0.5, "positions": "last"}],
                       f"generate.max_new_tokens={NEW}", output=tmp_path / "out" / "f.h5"))
    message = str(raised.value)
    assert message.startswith("intervene[0] (scale at lm_head): positions=last at a module "
                              "that computes only the last position of the call")
    assert "does not lie" not in message and "\n" not in message
    assert no_h5_files(tmp_path / "out")
    with pytest.raises(ConfigError, match=r"^intervene\[0\] \(heads \[0\] at attn\): Linear "
                                          "is given no tensor by position"):
        _on_input("intervene[0] (heads [0] at attn)", None, torch.nn.Linear(2, 2), (),
                  {"input": torch.ones(2)})
