"""Encoder-decoders (T5, BART): fed a text, their encoder's rows equal the encoder run on each
document alone; fed a target (dataset.target_column), their decoder's rows, one per target token
with their own /decoder_offsets, equal the model run on each pair alone, and equal the rows of
the same tokens when the model generated them greedily; cross-attention patterns sum to 1 over
the text's tokens; without a target, hooking the decoder is one line. Tiny random models made
here."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import no_h5_files
from tests.tiny_text import documents, write_jsonl

transformers = pytest.importorskip("transformers")

DOCS = documents(5, seed=6, low=3, high=10)


@pytest.fixture(scope="module", params=["t5", "bart"])
def seq2seq(request, tiny_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_lm)
    vocab = len(tokenizer)
    torch.manual_seed(0)
    if request.param == "t5":
        config = transformers.T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=64,
                                       num_layers=2, num_heads=4, decoder_start_token_id=0,
                                       pad_token_id=0)
        model, layer = transformers.T5ForConditionalGeneration(config), "encoder.block.1"
        decoder = "decoder.block.1"
    else:
        config = transformers.BartConfig(vocab_size=vocab, d_model=32, encoder_layers=2,
                                         decoder_layers=2, encoder_attention_heads=4,
                                         decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=64)
        model = transformers.BartForConditionalGeneration(config)
        layer, decoder = "model.encoder.layers.1", "model.decoder.layers.1"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model.eval(), layer, decoder


def _cfg(make_cfg, folder, layer, corpus, *extra):
    return make_cfg("model=transformers", f"model.name={folder}", "dataset=text",
                    f"dataset.path={corpus}", f"layers=[{layer}]", "batch_size=2", *extra)


def test_the_encoders_rows_equal_each_document_alone(seq2seq, make_cfg, tmp_path):
    folder, model, layer, _ = seq2seq
    corpus = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    path = probe.run(_cfg(make_cfg, folder, layer, corpus))
    modules = dict(model.named_modules())
    with h5py.File(path) as f:
        bounds, ids, rows = f["offsets"][:], f["input_ids"][:], f[f"{layer}/output"][:]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        seen = {}

        def keep(module, args, out, seen=seen):  # returns None: the output stays the model's
            seen["v"] = out[0] if isinstance(out, tuple) else out

        handle = modules[layer].register_forward_hook(keep)
        with torch.no_grad():  # the whole model, its decoder on one token (any: the encoder
            # computes before it, from the document alone)
            model(input_ids=torch.as_tensor(ids[a:b], dtype=torch.long)[None],
                  decoder_input_ids=torch.ones((1, 1), dtype=torch.long))
        handle.remove()
        np.testing.assert_allclose(rows[a:b], seen["v"][0].numpy(), rtol=1e-5, atol=1e-5)


PAIRS = [(text, target) for text, target in zip(DOCS, documents(5, seed=7, low=2, high=6),
                                                 strict=True)]


def _pairs(path, pairs=PAIRS):
    path.write_text("".join(json.dumps({"text": a, "target": b}) + "\n" for a, b in pairs))
    return path


def _alone(model, module, ids, decoder_ids):
    """``module``'s output when the model runs on one pair alone, without padding."""
    seen = {}

    def keep(module, args, out):
        seen["v"] = out[0] if isinstance(out, tuple) else out

    handle = module.register_forward_hook(keep)
    with torch.no_grad():
        model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None],
              decoder_input_ids=torch.as_tensor(decoder_ids, dtype=torch.long)[None])
    handle.remove()
    return seen["v"][0].numpy()


def test_the_decoders_rows_are_the_targets_teacher_forced(seq2seq, make_cfg, tmp_path):
    folder, model, layer, decoder = seq2seq
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    corpus = _pairs(tmp_path / "pairs.jsonl")
    path = probe.run(_cfg(make_cfg, folder, f"{layer},{decoder}", corpus,
                          "dataset.target_column=target"))
    modules = dict(model.named_modules())
    with h5py.File(path) as f:
        bounds, ids, rows = f["offsets"][:], f["input_ids"][:], f[f"{layer}/output"][:]
        ends, read, decoded = (f["decoder_offsets"][:], f["decoder_input_ids"][:],
                               f[f"{decoder}/output"][:])
        assert f[f"{decoder}/output"].attrs["offsets"] == "decoder_offsets"
        assert "offsets" not in f[f"{layer}/output"].attrs
    for n, (_, target) in enumerate(PAIRS):
        labels = tokenizer(text_target=target)["input_ids"]
        a, b = ends[n], ends[n + 1]
        assert b - a == len(labels)  # a row per target token
        shifted = model.prepare_decoder_input_ids_from_labels(
            labels=torch.tensor([labels]))[0].numpy()
        np.testing.assert_array_equal(read[a:b], shifted)
        np.testing.assert_allclose(decoded[a:b], _alone(model, modules[decoder],
                                                        ids[bounds[n]:bounds[n + 1]], shifted),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rows[bounds[n]:bounds[n + 1]],
                                   _alone(model, modules[layer], ids[bounds[n]:bounds[n + 1]],
                                          shifted), rtol=1e-5, atol=1e-5)
    with probe.open(path) as f:  # the reader bounds each key's rows by its own offsets
        np.testing.assert_array_equal(f.rows_of(f"{decoder}/output", row=1),
                                      decoded[ends[1]:ends[2]])
        np.testing.assert_array_equal(f.rows_of(f"{layer}/output", row=1),
                                      rows[bounds[1]:bounds[2]])


def test_a_generated_tokens_row_is_its_teacher_forced_row(seq2seq, make_cfg, tmp_path):
    folder, model, layer, decoder = seq2seq
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    texts = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    made = probe.run(_cfg(make_cfg, folder, decoder, texts, "generate.max_new_tokens=4",
                          "generate.stop_at_eos=false", "output.path=" + str(tmp_path / "g.h5")))
    with h5py.File(made) as f:
        ends, read, generated = (f["decoder_offsets"][:], f["decoder_input_ids"][:],
                                 f[f"{decoder}/output"][:])
    pairs, kept = [], []
    for n, text in enumerate(DOCS):  # the greedy answer, by transformers alone
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        answer = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None,
                                decoder_start_token_id=int(read[ends[n]]))[0, 1:].tolist()
        np.testing.assert_array_equal(read[ends[n] + 1:ends[n + 1]], answer[:-1])
        words = tokenizer.decode(answer, skip_special_tokens=False)
        if tokenizer(text_target=words)["input_ids"][:len(answer)] == answer:
            pairs.append((text, words))  # its tokens, written as a target, read back as such
            kept.append(n)
    assert len(kept) >= 2, "too few answers survive a round trip through text"
    forced = probe.run(_cfg(make_cfg, folder, decoder, _pairs(tmp_path / "p.jsonl", pairs),
                            "dataset.target_column=target",
                            "output.path=" + str(tmp_path / "t.h5")))
    with h5py.File(forced) as f:
        bounds, rows = f["decoder_offsets"][:], f[f"{decoder}/output"][:]
    for m, n in enumerate(kept):
        steps = ends[n + 1] - ends[n]
        np.testing.assert_allclose(rows[bounds[m]:bounds[m] + steps],
                                   generated[ends[n]:ends[n + 1]], rtol=1e-4, atol=1e-5)


def test_the_decoders_patterns_are_the_eager_models(seq2seq, make_cfg, tmp_path):
    """hooks=[attention] on the decoder's self-attention and cross-attention: each target
    token's weights over the target's tokens before it, and over the text's tokens (zeros
    after each sample's), equal to the eager model's output_attentions on the pair alone."""
    folder, model, _, _ = seq2seq
    names = ("decoder.blocks.1.attention", "decoder.blocks.1.cross_attention")
    path = probe.run(_cfg(make_cfg, folder, ",".join(names), _pairs(tmp_path / "p.jsonl"),
                          "dataset.target_column=target", "hooks=[attention]",
                          "dataset.max_length=16"))
    with h5py.File(path) as f:
        bounds, ends = f["offsets"][:], f["decoder_offsets"][:]
        ids, read = f["input_ids"][:], f["decoder_input_ids"][:]
        patterns = {name: f[f"{name}/attention"][:] for name in names}
    assert all(p.shape[0] == ends[-1] and p.shape[-1] == 16 for p in patterns.values())
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        for n in range(len(PAIRS)):
            source = torch.as_tensor(ids[bounds[n]:bounds[n + 1]], dtype=torch.long)[None]
            target = torch.as_tensor(read[ends[n]:ends[n + 1]], dtype=torch.long)[None]
            with torch.no_grad():
                out = model(input_ids=source, decoder_input_ids=target, output_attentions=True)
            for name, eager in zip(names, (out.decoder_attentions[1], out.cross_attentions[1]),
                                   strict=True):
                rows = patterns[name][ends[n]:ends[n + 1]]  # (queries, heads, 16)
                keys = eager.shape[-1]
                np.testing.assert_allclose(rows[..., :keys].transpose(1, 0, 2), eager[0].numpy(),
                                           rtol=1e-5, atol=1e-6)
                assert not rows[..., keys:].any()  # zeros after the sample's keys
    finally:
        model.set_attn_implementation(before)


def test_the_decoder_without_a_target_is_one_line(seq2seq, make_cfg, tmp_path):
    folder, _, _, decoder = seq2seq
    corpus = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    with pytest.raises(ConfigError) as caught:
        probe.run(_cfg(make_cfg, folder, decoder, corpus))
    said = str(caught.value)
    assert said.startswith(f"{decoder} is in the decoder of ") and "\n" not in said
    assert "dataset.target_column" in said
    assert no_h5_files(tmp_path)


@pytest.mark.parametrize("case", ["decoder-only", "no such column", "empty target",
                                  "generating with a target"])
def test_a_bad_target_is_one_line_and_no_file(case, seq2seq, tiny_lm, make_cfg, tmp_path):
    folder, _, layer, decoder = seq2seq
    pairs = [*PAIRS[:2], (PAIRS[2][0], "")] if case == "empty target" else PAIRS
    corpus = _pairs(tmp_path / "pairs.jsonl", pairs)
    column = "nope" if case == "no such column" else "target"
    model = tiny_lm if case == "decoder-only" else folder
    with pytest.raises((ConfigError, DataError)) as caught:
        probe.run(_cfg(make_cfg, model, "transformer.h.1" if case == "decoder-only" else decoder,
                       corpus, f"dataset.target_column={column}", "batch_size=3",
                       *(["generate.max_new_tokens=2"] if case.startswith("generating") else [])))
    said = str(caught.value)
    assert "\n" not in said
    expected = {"decoder-only": "has no decoder", "no such column": "'nope'",
                "empty target": "not a target text",
                "generating with a target": "reads either its own answer or the target"}
    assert expected[case] in said, said
    assert no_h5_files(tmp_path)


def test_readers_bound_the_decoders_rows_by_their_own_offsets(seq2seq, make_cfg, tmp_path):
    """xarray, parquet and compare read a decoder key by /decoder_offsets: its coordinates are
    the decoder's tokens; compare, which pairs texts' tokens, says in one line it does not pair
    them yet."""
    pytest.importorskip("xarray")
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from probe.analyses.compare import compare
    from probe.file.exports import export

    folder, _, layer, decoder = seq2seq
    path = probe.run(_cfg(make_cfg, folder, f"{layer},{decoder}", _pairs(tmp_path / "p.jsonl"),
                          "dataset.target_column=target"))
    key = f"{decoder}/output"
    with probe.open(path) as f, h5py.File(path) as h:
        array = f.to_xarray(key)
        ends, read = h["decoder_offsets"][:], h["decoder_input_ids"][:]
        assert array.shape[0] == ends[-1] != h["offsets"][-1]
        np.testing.assert_array_equal(array["decoder_input_ids"].values, read)
        np.testing.assert_array_equal(array["sample"].values,
                                      np.repeat(np.arange(len(PAIRS)), np.diff(ends)))
    export(path, "parquet", keys=[key], out_dir=tmp_path / "pq")
    table = pq.read_table(next((tmp_path / "pq").glob("*.parquet")))
    assert table.num_rows == ends[-1]
    assert table.column("decoder_input_ids").to_pylist() == read.tolist()
    with pytest.raises(ConfigError, match="does not pair yet") as caught:
        compare(path, keys=[key])
    assert "\n" not in str(caught.value)


def test_an_intervention_in_the_decoder_changes_its_rows_as_the_model_alone(seq2seq, make_cfg,
                                                                           tmp_path):
    """+intervene in an encoder-decoder: every position of the module (its calls hold two
    sequences, a text and a target: other positions are one line)."""
    from omegaconf import OmegaConf

    folder, model, _, decoder = seq2seq
    modules = dict(model.named_modules())
    at = {"t5": "decoder.block.0.layer.1", "bart": "model.decoder.layers.0.encoder_attn"}[
        "t5" if "T5" in type(model).__name__ else "bart"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    # a batch whose text and target pad to the same length, each padded where the other is
    # not: the text's mask, read as the target's, would leave target tokens unchanged
    pairs = [("cat", "sat on"), ("sat on", "cat")]
    counts = [(len(tokenizer(a)["input_ids"]), len(tokenizer(text_target=b)["input_ids"]))
              for a, b in pairs]
    assert counts[0][0] < counts[0][1] and counts[0][::-1] == counts[1], counts
    corpus = _pairs(tmp_path / "p.jsonl", pairs)
    cfg = _cfg(make_cfg, folder, decoder, corpus, "dataset.target_column=target")
    cfg.intervene = OmegaConf.create([{"at": at, "do": "zero"}])
    path = probe.run(cfg)

    def zero(module, args, out):
        return (torch.zeros_like(out[0]), *out[1:]) if isinstance(out, tuple) else out * 0

    handle = modules[at].register_forward_hook(zero)
    try:
        with probe.open(path) as f:
            for n, (text, target) in enumerate(pairs):
                labels = torch.tensor([tokenizer(text_target=target)["input_ids"]])
                shifted = model.prepare_decoder_input_ids_from_labels(labels=labels)[0]
                want = _alone(model, modules[decoder], tokenizer(text)["input_ids"], shifted)
                np.testing.assert_allclose(f.rows_of(f"{decoder}/output", row=n), want,
                                           rtol=1e-5, atol=1e-5)
    finally:
        handle.remove()
    cfg.intervene = OmegaConf.create([{"at": at, "do": "zero", "positions": "last"}])
    cfg.output.path = str(tmp_path / "last.h5")
    with pytest.raises(ConfigError, match="hold two sequences") as caught:
        probe.run(cfg)
    assert "\n" not in str(caught.value)
