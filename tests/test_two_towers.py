"""Two-tower image-text models (CLIP, SigLIP): images run the vision tower, text the text
tower, each row equal to the tower run alone on one image or caption; a layer of the tower that
the data does not feed is one line. Tiny checkpoints made here; nothing is downloaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError
from tests.conftest import no_h5_files
from tests.tiny_text import write_jsonl
from tests.tiny_vision import CAPTIONS, pictures, tiny_clip

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-towers")
    pictures(root / "images")
    return {"clip": tiny_clip(root / "clip"), "siglip": tiny_clip(root / "siglip", kind="siglip"),
            "images": root / "images", "captions": write_jsonl(root / "captions.jsonl",
                                                                list(CAPTIONS))}


def _model(folder):
    return transformers.AutoModel.from_pretrained(folder).eval()


def _hooked(module: torch.nn.Module, run) -> torch.Tensor:
    seen = []
    handle = module.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return seen[0][0]


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_images_run_the_vision_tower(make_cfg, folders, kind):
    from PIL import Image

    layer = "vision_model.encoder.layers.1"
    path = probe.run(make_cfg("model=transformers", f"model.name={folders[kind]}",
                              "dataset=imagefolder", f"dataset.root={folders['images']}",
                              f"layers=[{layer},vision_model.encoder.layers.0]",
                              "tokens=patches", "batch_size=4"))
    model = _model(folders[kind])
    processor = transformers.AutoImageProcessor.from_pretrained(folders[kind])
    prefix = 1 if kind == "clip" else 0  # SigLIP's vision tower has no class token
    with probe.open(path) as f:
        stored = f[f"{layer}/output"][:]
    assert stored.shape == (6, 32, 4, 4)
    for n, file in enumerate(sorted(folders["images"].glob("*/*.png"))):
        pixels = processor(images=Image.open(file).convert("RGB"), return_tensors="pt")
        want = _hooked(dict(model.named_modules())[layer],
                       lambda p=pixels: model.vision_model(**p))
        np.testing.assert_allclose(stored[n], want[prefix:].T.reshape(32, 4, 4).numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_text_runs_the_text_tower(make_cfg, folders):
    layer = "text_model.encoder.layers.1"
    path = probe.run(make_cfg("model=transformers", f"model.name={folders['clip']}",
                              "dataset=text", f"dataset.path={folders['captions']}",
                              f"layers=[{layer},text_projection]", "batch_size=4"))
    model = _model(folders["clip"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["clip"])
    with probe.open(path) as f:
        rows, offsets = f[f"{layer}/output"][:], f.offsets
        projected = f["text_projection/output"][:]
    assert projected.shape == (6, 16)  # the pooled caption's embedding, one row per caption
    for n, caption in enumerate(CAPTIONS):
        ids = tokenizer(caption, return_tensors="pt")
        want = _hooked(dict(model.named_modules())[layer], lambda i=ids: model.text_model(**i))
        np.testing.assert_allclose(rows[offsets[n]:offsets[n + 1]], want.numpy(), rtol=1e-5,
                                   atol=1e-5, err_msg=caption)
        with torch.no_grad():
            embedding = model.get_text_features(**ids)
        embedding = getattr(embedding, "pooler_output", embedding)
        np.testing.assert_allclose(projected[n], embedding[0].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("data", "layer", "tower"), [
    (["dataset=imagefolder", "dataset.root={images}"], "text_model.encoder.layers.0", "text"),
    (["dataset=text", "dataset.path={captions}"], "vision_model.encoder.layers.0", "vision"),
])
def test_a_layer_of_the_other_tower_is_one_line(make_cfg, folders, tmp_path, data, layer, tower):
    data = [d.format(**folders) for d in data]
    other = {"text": "vision", "vision": "text"}[tower]
    with pytest.raises(ConfigError, match=rf"layer {layer} is in the {tower} tower.*runs the "
                                          rf"{other} tower only") as err:
        probe.run(make_cfg("model=transformers", f"model.name={folders['clip']}", *data,
                           f"layers=[{layer}]"))
    assert "\n" not in str(err.value)
    assert no_h5_files(tmp_path)


@pytest.fixture(scope="module")
def pairs(folders):
    from tests.tiny_vision import write_pairs

    images = sorted(folders["images"].glob("*/*.png"))
    return write_pairs(folders["images"].parent / "pairs.csv", images)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_pairs_gradients_of_the_matched_logit(make_cfg, folders, pairs, kind):
    from PIL import Image

    vision, text = "vision_model.encoder.layers.0", "text_model.encoder.layers.1"
    path = probe.run(make_cfg("model=transformers", f"model.name={folders[kind]}",
                              "dataset=pairs", f"dataset.path={pairs}",
                              f"layers=[{vision},{text}]", "hooks=[forward,backward]",
                              "objective=similarity", "batch_size=4"))
    model = _model(folders[kind])
    processor = transformers.AutoImageProcessor.from_pretrained(folders[kind])
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders[kind])
    modules = dict(model.named_modules())
    with probe.open(path) as f:
        stored = {key: f[key][:] for key in (f"{vision}/output", f"{vision}/grad_output",
                                             f"{text}/output", f"{text}/grad_output")}
        captions = [str(c) for c in f["caption"].asstr()[:]]
        files = [str(c) for c in f["file"].asstr()[:]]
    assert captions == list(CAPTIONS)
    for n, (file, caption) in enumerate(zip(files, captions, strict=True)):
        pixels = processor(images=Image.open(pairs.parent / file).convert("RGB"),
                           return_tensors="pt")["pixel_values"]
        ids = tokenizer(caption, padding="max_length", max_length=12, return_tensors="pt")
        seen = {}
        handles = [modules[name].register_forward_hook(
            lambda m, a, out, name=name, seen=seen: seen.setdefault(name, out))
            for name in (vision, text)]
        logit = model(pixel_values=pixels, **ids).logits_per_image[0, 0]  # the pair alone
        for handle in handles:
            handle.remove()
        grads = torch.autograd.grad(logit, [seen[vision], seen[text]])
        for name, grad in zip((vision, text), grads, strict=True):
            np.testing.assert_allclose(stored[f"{name}/output"][n],
                                       seen[name][0].detach().numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(stored[f"{name}/grad_output"][n], grad[0].numpy(),
                                       rtol=1e-4, atol=1e-6, err_msg=f"{name} pair {n}")
        assert np.abs(stored[f"{text}/grad_output"][n]).max() > 0


def test_similarity_needs_pairs(make_cfg, folders, tmp_path):
    with pytest.raises(ConfigError, match=r"objective=similarity .* needs both towers.*"
                                          r"dataset=pairs"):
        probe.run(make_cfg("model=transformers", f"model.name={folders['clip']}",
                           "dataset=imagefolder", f"dataset.root={folders['images']}",
                           "layers=[vision_model.encoder.layers.0]", "hooks=[backward]",
                           "objective=similarity"))
    assert no_h5_files(tmp_path)


@pytest.mark.parametrize(("extra", "error", "message"), [
    (["dataset.text_column=caption"], ConfigError,
     r"dataset.text_column='caption' is not a column of .*pairs.csv; it has image, text"),
    (["dataset.path=/no/such/pairs.csv"], DataError, r"no such file"),
])
def test_bad_pairs_are_one_line(make_cfg, folders, pairs, tmp_path, extra, error, message):
    with pytest.raises(error, match=message) as err:
        probe.run(make_cfg("model=transformers", f"model.name={folders['clip']}",
                           "dataset=pairs", f"dataset.path={pairs}", *extra,
                           "layers=[vision_model.encoder.layers.0]"))
    assert "\n" not in str(err.value)
    assert no_h5_files(tmp_path)


def test_a_reduce_of_the_text_tower_in_pairs_is_refused(make_cfg, folders, pairs, tmp_path):
    layer = "text_model.encoder.layers.1"
    with pytest.raises(ConfigError, match=rf"reduce=mean on {layer}: in a pairs run the text "
                                          r"tower's outputs are stored whole"):
        probe.run(make_cfg("model=transformers", f"model.name={folders['clip']}",
                           "dataset=pairs", f"dataset.path={pairs}", f"layers=[{layer}]",
                           "reduce=mean"))
    assert no_h5_files(tmp_path)


def test_a_tokenizer_without_a_padding_token_pads_captions_with_its_end_token(
        make_cfg, folders, pairs, tmp_path):
    """As text runs do; it was "dataset sample 0 (<image>) cannot be loaded", blaming an image."""
    import shutil

    unpadded = tmp_path / "clip-unpadded"
    shutil.copytree(folders["clip"], unpadded)
    tokenizer = transformers.AutoTokenizer.from_pretrained(unpadded)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(unpadded)
    assert transformers.AutoTokenizer.from_pretrained(unpadded).pad_token is None
    layer = "text_model.encoder.layers.1/output"
    runs = {name: probe.run(make_cfg("model=transformers", f"model.name={model}",
                                     "dataset=pairs", f"dataset.path={pairs}",
                                     f"layers=[{layer.split('/')[0]}]",
                                     output=tmp_path / f"{name}.h5"))
            for name, model in (("padded", folders["clip"]), ("unpadded", unpadded))}
    with probe.open(runs["padded"]) as a, probe.open(runs["unpadded"]) as b:
        for n, caption in enumerate(a["caption"].asstr()[:]):
            real = len(tokenizer(caption)["input_ids"])  # the caption's own positions
            np.testing.assert_array_equal(a[layer][n, :real], b[layer][n, :real])
