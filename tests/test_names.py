"""Standard layer names (blocks.N, blocks.-1, blocks.*, blocks.50%, .attention, .mlp,
embeddings, final_norm, lm_head, encoder./decoder. stacks): one config sweeps models of
different architectures into files with the same keys, which probe.compare pairs; each dataset
says its module, the per-run checks are in the root attrs, a mis-mapped name stops the run in
one line, and a name the model has no part for is one line. Tiny models made here."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.analyses.compare import compare
from probe.errors import ConfigError
from probe.families.names import Stack, StandardNames
from tests.conftest import no_h5_files, run_cli
from tests.tiny_text import documents, write_jsonl

transformers = pytest.importorskip("transformers")

DOCS = documents(5, seed=4, low=2, high=10)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("names") / "docs.jsonl", DOCS)


def _with_tokenizer(tiny_lm, folder, model):
    torch.manual_seed(0)
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(tiny_lm).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models(tiny_lm, tmp_path_factory):
    """GPT-2 (transformer.h.N), Llama (model.layers.N) and BERT (bert.encoder.layer.N), two
    blocks each, on the GPT-2's tokenizer."""
    vocab = len(transformers.AutoTokenizer.from_pretrained(tiny_lm))
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": vocab, "max_position_embeddings": 128}
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2,
                                                                   **sizes))
    bert = transformers.BertForMaskedLM(transformers.BertConfig(**sizes))
    return {"gpt2": tiny_lm,
            "llama": _with_tokenizer(tiny_lm, tmp_path_factory.mktemp("llama"), llama),
            "bert": _with_tokenizer(tiny_lm, tmp_path_factory.mktemp("bert"), bert)}


def _cfg(make_cfg, model, corpus, layers, *extra, output=None):
    return make_cfg("model=transformers", f"model.name={model}", "dataset=text",
                    f"dataset.path={corpus}", f"layers={layers}", "batch_size=2", *extra,
                    output=output)


def test_one_config_sweeps_architectures_into_the_same_keys(make_cfg, models, corpus,
                                                            tmp_path):
    paths = {name: probe.run(_cfg(make_cfg, folder, corpus, "[blocks.1,blocks.-1.attention]",
                                  "tokens=mean", output=tmp_path / f"{name}.h5"))
             for name, folder in models.items()}
    modules = {"gpt2": ("transformer.h.1", "transformer.h.1.attn"),
               "llama": ("model.layers.1", "model.layers.1.self_attn"),
               "bert": ("bert.encoder.layer.1", "bert.encoder.layer.1.attention.self")}
    for name, path in paths.items():
        with h5py.File(path) as f:
            assert {"blocks.1", "blocks.-1.attention"} <= set(f)
            assert f["blocks.1/output"].attrs["module"] == modules[name][0]
            assert f["blocks.-1.attention/output"].attrs["module"] == modules[name][1]
            assert f.attrs["architecture"] == name
            assert json.loads(f.attrs["modules"]) == {"blocks.1": modules[name][0],
                                                      "blocks.-1.attention": modules[name][1]}
            verified = json.loads(f.attrs["verified"])
            assert verified["names"].startswith("pass") and verified["blocks"].startswith("pass")
    # compare pairs the two models' keys by name, as it pairs one model's runs
    result = compare(paths["gpt2"], paths["llama"])
    assert result.keys_a == result.keys_b == ["blocks.1/output", "blocks.-1.attention/output"]
    assert 0 < result.values[("blocks.1/output", "blocks.1/output")] <= 1


def test_the_rows_are_the_real_modules_rows(make_cfg, models, corpus, tmp_path):
    standard = probe.run(_cfg(make_cfg, models["llama"], corpus, "[blocks.*,final_norm]",
                              output=tmp_path / "s.h5"))
    real = probe.run(_cfg(make_cfg, models["llama"], corpus,
                          "[model.layers.0,model.layers.1,model.norm]", output=tmp_path / "r.h5"))
    with h5py.File(standard) as s, h5py.File(real) as r:
        for name, path in (("blocks.0", "model.layers.0"), ("blocks.1", "model.layers.1"),
                           ("final_norm", "model.norm")):
            np.testing.assert_array_equal(s[f"{name}/output"][:], r[f"{path}/output"][:])
        assert "final_norm" in json.loads(s.attrs["verified"])


@pytest.mark.parametrize("depth, percent, block", [(12, 50, 5), (24, 50, 11), (3, 50, 1),
                                                   (12, 100, 11), (12, 1, 0), (4, 25, 0)])
def test_a_depth_fraction_is_the_block_whose_output_lies_there(depth, percent, block):
    names = StandardNames("toy", {"": Stack(tuple(f"h.{n}" for n in range(depth)))})
    assert names.expand(f"blocks.{percent}%") == [(f"blocks.{percent}%", f"h.{block}")]
    assert names.expand("blocks.-1") == [("blocks.-1", f"h.{depth - 1}")]
    assert [p for _, p in names.expand("blocks.*")] == [f"h.{n}" for n in range(depth)]


def test_a_mis_mapped_name_stops_the_run_in_one_line(make_cfg, models, corpus, tmp_path,
                                                     monkeypatch):
    from probe.families import hf_names

    def shifted(model):  # every block named one deeper than it is: blocks.0 is h.1
        found = hf_names._read(model)
        stack = found.stacks[""]
        blocks = (*stack.blocks[1:], stack.blocks[0])
        return StandardNames(found.architecture, {"": Stack(blocks, stack.parts, stack.singles,
                                                            stack.missing)})

    monkeypatch.setitem(hf_names._REGISTERED, "gpt2", shifted)
    with pytest.raises(ConfigError) as caught:
        probe.run(_cfg(make_cfg, models["gpt2"], corpus, "[blocks.0]", output=tmp_path / "x.h5"))
    said = str(caught.value)
    assert said.startswith("verify: gpt2's blocks does not hold: blocks.0 (transformer.h.1)")
    assert "verify=false" in said and "\n" not in said
    assert no_h5_files(tmp_path)
    path = probe.run(_cfg(make_cfg, models["gpt2"], corpus, "[blocks.0]", "verify=false",
                          output=tmp_path / "y.h5"))
    with h5py.File(path) as f:
        assert json.loads(f.attrs["verified"]) == {"skipped": "verify=false"}


@pytest.mark.parametrize("model, layer, said", [
    ("bert", "lm_head", "lm_head on bert: it has no next-token head"),
    ("gpt2", "decoder.blocks.1", "decoder.blocks.1 on gpt2: it has one stack of blocks, not an"),
    ("gpt2", "blocks.2", "blocks.2 on gpt2: it has 2 blocks, blocks.0 to blocks.1"),
    ("gpt2", "blocks.-3", "blocks.-3 on gpt2: it has 2 blocks"),
    ("bert", "final_norm", "final_norm on bert: it has no norm after its last block"),
    ("gpt2", "blocks.0%", "blocks.0%: a depth fraction is above 0%"),
    ("gpt2", "[blocks.1,blocks.-1]", "layers names transformer.h.1 twice, as blocks.1 and as "
                                     "blocks.-1"),
])
def test_a_name_the_model_has_no_part_for_is_one_line(make_cfg, models, corpus, tmp_path,
                                                      model, layer, said):
    layers = layer if layer.startswith("[") else f"[{layer}]"
    with pytest.raises(ConfigError) as caught:
        probe.run(_cfg(make_cfg, models[model], corpus, layers, output=tmp_path / "x.h5"))
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)
    assert no_h5_files(tmp_path)


def test_a_model_without_standard_names_says_so():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with pytest.raises(ConfigError, match=r"^blocks.1 is a standard name, which Sequential's "):
        probe.attach(model, ["blocks.1"])


def test_a_module_named_like_a_standard_name_wins(make_cfg, models, corpus, tmp_path):
    # BertModel (model.head=base) has a module of its own called "embeddings"
    path = probe.run(_cfg(make_cfg, models["bert"], corpus, "[embeddings,blocks.0]",
                          "model.head=base", output=tmp_path / "b.h5"))
    with h5py.File(path) as f:
        assert "module" not in f["embeddings/output"].attrs  # the real one, by its own name
        assert f["blocks.0/output"].attrs["module"] == "encoder.layer.0"


@pytest.mark.process  # a sweep of real processes, as a user runs it
def test_the_cli_sweeps_and_lists_both_names(models, corpus, tmp_path):
    names = ",".join(str(models[m]) for m in ("gpt2", "llama"))
    done = run_cli("-m", "model=transformers", f"model.name={names}", "dataset=text",
                   f"dataset.path={corpus}", "layers=[blocks.1]", "tokens=last", cwd=tmp_path,
                   HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    files = sorted((tmp_path / "outputs" / "multirun").rglob("features.h5"))
    assert len(files) == 2
    for path in files:
        with h5py.File(path) as f:
            assert "blocks.1" in f and f["blocks.1/output"].shape[0] == len(DOCS)
    listed = run_cli("model=transformers", f"model.name={models['llama']}", cwd=tmp_path,
                     module="probe.layers", HF_HUB_OFFLINE="1")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines() if line}
    assert rows["model.layers.1.self_attn"][-1] == "blocks.1.attention"
    assert rows["model.norm"][-1] == "final_norm"


def _vit(tmp_path):
    from tests.tiny_vision import pictures, tiny_vit

    pictures(tmp_path / "images")
    return [f"model.name={tiny_vit(tmp_path / 'vit')}", "dataset=imagefolder",
            f"dataset.root={tmp_path / 'images'}"], "vit.layers.1"


def _wav2vec2(tmp_path):
    from tests.tiny_audio import clip_folder, tiny_wav2vec2

    return [f"model.name={tiny_wav2vec2(tmp_path / 'w2v')}", "model.head=base", "dataset=audio",
            f"dataset.root={clip_folder(tmp_path / 'clips', [1.0, 0.5])}"], "encoder.layers.1"


def _whisper(tmp_path):
    from tests.tiny_audio import clip_folder, tiny_whisper

    return [f"model.name={tiny_whisper(tmp_path / 'whisper')}", "dataset=audio",
            f"dataset.root={clip_folder(tmp_path / 'clips', [1.0, 0.5])}"], "encoder.layers.1"


@pytest.mark.parametrize("family, layer", [(_vit, "blocks.1"), (_wav2vec2, "blocks.1"),
                                           (_whisper, "encoder.blocks.1")])
def test_the_other_hugging_face_families_have_the_names_too(make_cfg, tmp_path, family, layer):
    overrides, module = family(tmp_path)
    path = probe.run(make_cfg("model=transformers", *overrides, f"layers=[{layer}]",
                              output=tmp_path / "x.h5"))
    with h5py.File(path) as f:
        assert f[f"{layer}/output"].attrs["module"] == module
        assert json.loads(f.attrs["verified"])[layer.rpartition("blocks")[0] + "blocks"] \
            .startswith("pass")


def test_a_vision_language_model_names_its_language_model_and_vision_tower(make_cfg, tmp_path):
    from tests.tiny_vision import pictures, write_pairs
    from tests.tiny_vlm import tiny_vlm

    folder = tiny_vlm("llava", tmp_path / "llava")
    pairs = write_pairs(tmp_path / "pairs.csv", pictures(tmp_path / "images"))
    path = probe.run(make_cfg("model=transformers", f"model.name={folder}", "dataset=pairs",
                              f"dataset.path={pairs}", "layers=[blocks.1,vision.blocks.1]",
                              "tokens=last", output=tmp_path / "x.h5"))
    with h5py.File(path) as f:
        assert json.loads(f.attrs["modules"]) == {
            "blocks.1": "model.language_model.layers.1",
            "vision.blocks.1": "model.vision_tower.encoder.layers.1"}
        verified = json.loads(f.attrs["verified"])
        assert verified["blocks"].startswith("pass")
        assert verified["vision.blocks"].startswith("not checked")
    # a standard name's rows are its module's: the vision tower's layout pools them, a row
    # per image, whichever name the layer is given by
    rows = {}
    for layer in ("vision.blocks.1", "model.vision_tower.encoder.layers.1"):
        path = probe.run(make_cfg("model=transformers", f"model.name={folder}", "dataset=pairs",
                                  f"dataset.path={pairs}", "tokens=mean", f"layers=[{layer}]",
                                  output=tmp_path / f"{layer}.h5"))
        with h5py.File(path) as f:
            rows[layer] = f[f"{layer}/output"][:]
            assert list(f[f"{layer}/output"].attrs["dims"]) == ["sample", "feature"]
    np.testing.assert_array_equal(*rows.values())


def test_shards_of_a_depth_fraction_merge_into_the_unsharded_run(make_cfg, models, corpus,
                                                                tmp_path):
    # HDF5 reads a % in a virtual dataset's source name as a pattern: blocks.50% must merge
    from probe.file.merge import merge

    layers = "[blocks.50%,blocks.-1.attention]"
    shards = [probe.run(_cfg(make_cfg, models["llama"], corpus, layers, "shard.count=2",
                             f"shard.index={n}", output=tmp_path / f"s{n}.h5"))
              for n in range(2)]
    whole = probe.run(_cfg(make_cfg, models["llama"], corpus, layers, output=tmp_path / "w.h5"))
    merged = merge(tmp_path / "merged.h5", shards)

    def rows(path, key):
        with h5py.File(path) as f:
            bounds, index, values = f["offsets"][:], f["index"][:], f[key][:]
            assert list(f[key].attrs["dims"]) == ["token", "feature"]
        return {int(i): values[a:b] for i, a, b in zip(index, bounds[:-1], bounds[1:],
                                                       strict=True)}

    for key in ("blocks.50%/output", "blocks.-1.attention/output"):
        ours, theirs = rows(merged, key), rows(whole, key)
        assert ours.keys() == theirs.keys()
        for i in ours:  # other batches pad otherwise: float32 rounding apart
            np.testing.assert_allclose(ours[i], theirs[i], rtol=1e-5, atol=1e-6)
