"""Encoder-decoders read as language models (T5, BART): fed a text, their encoder's rows equal
the encoder run on each document alone; hooking the decoder, or generating, is one line (the
decoder's rows of a target are not stored yet), not a traceback. Tiny random models made here."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError
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


def test_the_decoder_and_generation_are_one_line(seq2seq, make_cfg, tmp_path):
    folder, _, layer, decoder = seq2seq
    corpus = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    with pytest.raises(ConfigError) as caught:
        probe.run(_cfg(make_cfg, folder, decoder, corpus))
    said = str(caught.value)
    assert said.startswith(f"{decoder} is in the decoder of ") and "\n" not in said
    with pytest.raises(ConfigError) as caught:
        probe.run(_cfg(make_cfg, folder, layer, corpus, "generate.max_new_tokens=2"))
    said = str(caught.value)
    assert "an encoder-decoder: its answer is its decoder's" in said and "\n" not in said
    assert no_h5_files(tmp_path)
