"""Attention patterns (hooks=[attention]): each stored pattern equals the eager model's
output_attentions for that sample alone (GPT-2 and a Llama with grouped key/value heads on
padded batches of text; a ViT on images), only the hooked modules run eager, and what cannot
be had is refused in one line that names the attention modules. Tiny models made here."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError
from tests.conftest import no_h5_files
from tests.tiny_text import documents, write_jsonl
from tests.tiny_vision import pictures, tiny_vit

transformers = pytest.importorskip("transformers")

DOCS = documents(7, seed=2, low=2, high=14)  # lengths differ: every batch is padded
LONGEST = 64  # dataset.max_length: the keys axis of a token's pattern


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("attention") / "docs.jsonl", DOCS)


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


def _text_cfg(make_cfg, model, corpus, layer, *extra, output=None):
    return make_cfg("model=transformers", f"model.name={model}", "dataset=text",
                    f"dataset.path={corpus}", f"dataset.max_length={LONGEST}",
                    f"layers=[{layer}]", "hooks=[attention]", "batch_size=4", *extra,
                    output=output)


def _eager_alone(folder, ids, block: int) -> np.ndarray:
    """Block ``block``'s attention weights (heads, L, L) of the eager model on ``ids`` alone."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor(ids, dtype=torch.long)[None], output_attentions=True)
    return out.attentions[block][0].numpy()


@pytest.mark.parametrize("name, layer, block", [
    ("gpt2", "transformer.h.1.attn", 1), ("llama", "model.layers.0.self_attn", 0)])
def test_token_patterns_equal_the_eager_model_on_each_sample_alone(
        make_cfg, tiny_lm, tiny_llama, corpus, name, layer, block):
    folder = {"gpt2": tiny_lm, "llama": tiny_llama}[name]
    path = probe.run(_text_cfg(make_cfg, folder, corpus, layer))
    key = f"{layer}/attention"
    with h5py.File(path) as f:
        bounds, ids, patterns = f["offsets"][:], f["input_ids"][:], f[key][:]
        attrs, eager = dict(f[key].attrs), list(f.attrs["eager_attention"])
    assert attrs["attention"] == "eager" and attrs["keys"].startswith(f"{LONGEST}:")
    assert list(attrs["dims"]) == ["token", "head", "key"] and eager == [layer]
    lengths = set()
    for n in range(len(DOCS)):
        rows = patterns[bounds[n]:bounds[n + 1]]  # (L, heads, LONGEST)
        length = len(rows)
        lengths.add(length)
        alone = _eager_alone(folder, ids[bounds[n]:bounds[n + 1]], block)  # (heads, L, L)
        np.testing.assert_allclose(rows[:, :, :length].transpose(1, 0, 2), alone, atol=1e-6)
        assert not rows[:, :, length:].any()  # the keys after the sample's length are zeros
    assert len(lengths) > 3


def test_tokens_last_keeps_the_last_query_row(make_cfg, tiny_lm, corpus, tmp_path):
    layer = "transformer.h.0.attn"
    every = probe.run(_text_cfg(make_cfg, tiny_lm, corpus, layer, output=tmp_path / "a.h5"))
    last = probe.run(_text_cfg(make_cfg, tiny_lm, corpus, layer, "tokens=last",
                               output=tmp_path / "l.h5"))
    with h5py.File(every) as a, h5py.File(last) as b:
        ends = a["offsets"][1:] - 1
        assert b[f"{layer}/attention"].shape == (len(DOCS), 2, LONGEST)
        np.testing.assert_array_equal(b[f"{layer}/attention"][:],
                                      a[f"{layer}/attention"][:][ends])


def test_only_the_hooked_module_runs_eager(make_cfg, tiny_lm, corpus, monkeypatch):
    from transformers.models.gpt2 import modeling_gpt2

    calls = []
    eager = modeling_gpt2.eager_attention_forward
    monkeypatch.setattr(modeling_gpt2, "eager_attention_forward",
                        lambda module, *a, **k: calls.append(module) or eager(module, *a, **k))
    cfg = _text_cfg(make_cfg, tiny_lm, corpus, "transformer.h.1.attn", "stop_early=false")
    plan = probe.plan(cfg)
    hooked = plan.model.transformer.h[1].attn
    calls.clear()
    probe.execute(plan)
    batches = -(-len(DOCS) // 4)
    assert len(calls) == batches and all(module is hooked for module in calls)
    assert plan.model.config._attn_implementation == "sdpa"  # restored after the run


def test_a_vit_stores_one_pattern_per_image(make_cfg, tmp_path):
    folder = tiny_vit(tmp_path / "vit")
    pictures(tmp_path / "images")
    model = transformers.ViTForImageClassification.from_pretrained(
        folder, attn_implementation="eager").eval()
    layer = next(name for name, m in model.named_modules()
                 if type(m).__name__ == "ViTSelfAttention" or type(m).__name__ == "ViTAttention"
                 and not any(type(c).__name__ == "ViTSelfAttention" for c in m.children()))
    common = ("model=transformers", f"model.name={folder}", "dataset=imagefolder",
              f"dataset.root={tmp_path / 'images'}", f"layers=[{layer}]", "hooks=[attention]",
              "batch_size=4")
    path = probe.run(make_cfg(*common, output=tmp_path / "all.h5"))
    first = probe.run(make_cfg(*common, "tokens=first", output=tmp_path / "first.h5"))
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    from PIL import Image

    with h5py.File(path) as f, h5py.File(first) as g:
        patterns, files = f[f"{layer}/attention"][:], [p.decode() for p in f["file"][:]]
        tokens = 1 + (32 // 8) ** 2
        assert patterns.shape == (len(files), 2, tokens, tokens)
        assert list(f[f"{layer}/attention"].attrs["dims"]) == ["sample", "head", "query", "key"]
        np.testing.assert_array_equal(g[f"{layer}/attention"][:], patterns[:, :, 0])
    for row, name in zip(patterns, files, strict=True):
        pixels = processor(images=Image.open(tmp_path / "images" / name).convert("RGB"),
                           return_tensors="pt")
        with torch.no_grad():
            alone = model(**pixels, output_attentions=True).attentions[0][0].numpy()
        np.testing.assert_allclose(row, alone, atol=1e-6)


def test_the_listing_marks_the_attention_modules(make_cfg, tiny_lm, corpus):
    from probe.pipeline.listing import layer_table

    rows = {row[0]: row for row in layer_table(_text_cfg(make_cfg, tiny_lm, corpus,
                                                         "transformer.h.0"))[1]}
    assert rows["transformer.h.0.attn/attention"][1:] == ("2 heads", f"(2, {LONGEST})",
                                                          f"{2 * LONGEST * 4} B",
                                                          "blocks.0.attention/attention")
    assert "transformer.h.0.mlp/attention" not in rows


@pytest.mark.parametrize("layer, extra, message", [
    ("transformer.h.0.mlp", (), "transformer.h.0.mlp is not an attention module .* this "
                                "model's attention modules: transformer.h.0.attn, "
                                "transformer.h.1.attn"),
    ("transformer.h.0.attn", ("reduce=mean",), "reduce=mean on transformer.h.0.attn/attention"),
    ("transformer.h.0.attn", ("tokens=patches",), "tokens=patches on transformer.h.0.attn"),
    ("transformer.h.0.attn", ("generate.max_new_tokens=2",),
     "attention patterns are not stored while a model generates"),
])
def test_what_patterns_cannot_be_is_one_line_and_no_file(make_cfg, tiny_lm, corpus, tmp_path,
                                                        layer, extra, message):
    with pytest.raises(ConfigError, match=message):
        probe.run(_text_cfg(make_cfg, tiny_lm, corpus, layer, *extra))
    assert no_h5_files(tmp_path)


def test_a_model_without_patterns_is_refused(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"hooks=\[attention\]: .* gives no patterns"):
        probe.run(make_cfg("layers=[features.0]", "hooks=[attention]"))
    assert no_h5_files(tmp_path)


def test_token_ids_without_a_bound_on_their_length_are_refused(make_cfg, tiny_lm, tmp_path):
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}\n')
    with pytest.raises(ConfigError, match="needs a bound .* set dataset.max_length"):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=tokens",
                           f"dataset.path={ids}", "layers=[transformer.h.0.attn]",
                           "hooks=[attention]"))
    assert no_h5_files(tmp_path)


@pytest.mark.parametrize("name", ["bloom", "deberta-v2"])  # every one: test_architectures
def test_modules_that_compute_their_own_weights_give_them_and_compute_as_before(name, tmp_path):
    # BLOOM and DeBERTa-v2 never call the attention interface: their weights come from their
    # own return value (DeBERTa-v2's only when asked, and its caller still gets None)
    from probe.families.hf_attention import eager_patterns
    from probe.families.hf_names import hf_names
    from tests.tiny_archs import tiny_checkpoint

    folder = tiny_checkpoint(name, tmp_path / name)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    module = dict(model.named_modules())[hf_names(model).table()["blocks.1.attention"]]
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [7, 8, 9, 0, 0, 0]])
    mask = (ids > 0).long()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                      output_attentions=True)
        given = []
        with eager_patterns(model, {module: "blocks.1.attention"},
                            lambda _, weights: given.append(weights)) as seen:
            hooked = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert list(seen) == ["blocks.1.attention"] and len(given) == 1
    torch.testing.assert_close(given[0], plain.attentions[1], rtol=0, atol=0)
    for a, b in zip(hooked.hidden_states, plain.hidden_states, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert hooked.attentions is None or hooked.attentions == ()
