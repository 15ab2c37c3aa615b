"""model=transformers on vision checkpoints: the checkpoint's own image processor, its class
from the config, token layouts (tokens=all|first|mean|patches) whose rows equal the model run
image by image, DINOv2's register tokens kept out of the patches, the reduce refusal, and
Grad-CAM on a ViT's patch grid. Tiny checkpoints made here; nothing is downloaded."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError
from tests.conftest import no_h5_files
from tests.tiny_vision import pictures, tiny_dinov2, tiny_vit

transformers = pytest.importorskip("transformers")

LAYER = "vit.layers.1"
BLOCK0 = "vit.layers.0"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-vision")
    return {"vit": tiny_vit(root / "vit"), "dinov2": tiny_dinov2(root / "dinov2"),
            "images": pictures(root / "images") and root / "images",
            "files": pictures(root / "images")}


def _run(make_cfg, folders, name: str, layer: str, *extra: str, output=None):
    return probe.run(make_cfg("model=transformers", f"model.name={folders[name]}",
                              "dataset=imagefolder", f"dataset.root={folders['images']}",
                              f"layers=[{layer}]", "batch_size=4", *extra, output=output))


def _one_by_one(folder, layer: str) -> list[torch.Tensor]:
    """The layer's output for each image file alone, through the checkpoint's own processor
    and the class its config names."""
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    from PIL import Image

    seen = []
    module = dict(model.named_modules())[layer]
    handle = module.register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        for path in pictures_in(folder):
            pixels = processor(images=Image.open(path).convert("RGB"), return_tensors="pt")
            with torch.no_grad():
                model(**pixels)
    finally:
        handle.remove()
    return [value[0] for value in seen]


def pictures_in(folder):
    # the image files in ImageFolder's order (classes, then files, sorted)
    return sorted((folder.parent / "images").glob("*/*.png"))


def test_vit_rows_equal_the_model_image_by_image(make_cfg, folders, tmp_path, caplog):
    want = torch.stack(_one_by_one(folders["vit"], LAYER))  # (6, 1 + 16 patches, 32)
    assert want.shape == (6, 17, 32)
    with caplog.at_level(logging.INFO):
        full = _run(make_cfg, folders, "vit", LAYER, output=tmp_path / "all.h5")
    pooled = {"first": want[:, 0], "mean": want.mean(1),
              "patches": want[:, 1:].reshape(6, 4, 4, 32).permute(0, 3, 1, 2)}
    with probe.open(full) as f:
        np.testing.assert_allclose(f[f"{LAYER}/output"][:], want.numpy(), rtol=1e-5, atol=1e-5)
        assert "ViTImageProcessor" in f.attrs["transform"]  # the checkpoint's own, recorded
    assert "ViTForImageClassification" in caplog.text  # model.head=auto: the config's class
    for tokens, expected in pooled.items():
        path = _run(make_cfg, folders, "vit", LAYER, f"tokens={tokens}",
                    output=tmp_path / f"{tokens}.h5")
        with h5py.File(path, "r") as f:
            stored = f[f"{LAYER}/output"]
            assert f.attrs["tokens"] == tokens
            np.testing.assert_allclose(stored[:], expected.numpy(), rtol=1e-5, atol=1e-5,
                                       err_msg=tokens)
    with h5py.File(tmp_path / "patches.h5", "r") as f:
        assert list(f[f"{LAYER}/output"].attrs["dims"]) == ["sample", "feature", "height",
                                                            "width"]


def test_dinov2_patches_leave_the_class_and_register_tokens_out(make_cfg, folders, tmp_path):
    layer = "encoder.layer.1"
    want = torch.stack(_one_by_one(folders["dinov2"], layer))
    assert want.shape == (6, 1 + 4 + 16, 32)  # class token, 4 registers, 4 x 4 patches
    path = _run(make_cfg, folders, "dinov2", layer, "tokens=patches", "reduce=max")
    with probe.open(path) as f:
        stored = f[f"{layer}/output"][:]
    assert stored.shape == (6, 32)  # reduce=max pools the patch grid, as a conv map's
    np.testing.assert_allclose(stored, want[:, 5:].amax(1).numpy(), rtol=1e-5, atol=1e-5)
    with_registers = want[:, 1:].amax(1).numpy()  # what mistaking registers for patches gives
    assert not np.allclose(stored, with_registers, atol=1e-3)


def test_reduce_on_a_vit_block_is_refused_and_points_at_tokens(make_cfg, folders, tmp_path):
    with pytest.raises(ConfigError, match=rf"reduce=mean on {LAYER}/output, a token layout.*"
                                          r"tokens=first.*tokens=patches") as err:
        _run(make_cfg, folders, "vit", LAYER, "reduce=mean")
    assert "\n" not in str(err.value)
    assert no_h5_files(tmp_path)


def test_gradcam_from_vit_patches_equals_the_formula(make_cfg, folders, tmp_path):
    from probe.analyses.gradcam import gradcam, write_gradcam

    # the last block's patches reach the class token's logits through no later block: their
    # gradient is zero, so the first block's
    path = _run(make_cfg, folders, "vit", BLOCK0, "tokens=patches", "hooks=[forward,backward]",
                "objective=top1")
    with probe.open(path) as f:
        acts, grads = f[f"{BLOCK0}/output"][:], f[f"{BLOCK0}/grad_output"][:]
    assert acts.shape == grads.shape == (6, 32, 4, 4) and np.abs(grads).max() > 0
    # the gradient of each image's top logit, taken directly, laid on the grid as stored
    config = transformers.AutoConfig.from_pretrained(folders["vit"])
    model = getattr(transformers, config.architectures[0]).from_pretrained(folders["vit"])
    processor = transformers.AutoImageProcessor.from_pretrained(folders["vit"])
    from PIL import Image

    first = processor(images=Image.open(pictures_in(folders["vit"])[0]).convert("RGB"),
                      return_tensors="pt")["pixel_values"]
    seen = []
    block = dict(model.eval().named_modules())[BLOCK0]
    handle = block.register_forward_hook(lambda m, a, out: seen.append(out))
    logits = model(pixel_values=first).logits
    handle.remove()
    (grad,) = torch.autograd.grad(logits.amax(), seen[0])
    np.testing.assert_allclose(grads[0], grad[0, 1:].T.reshape(32, 4, 4).numpy(), rtol=1e-4,
                               atol=1e-6)
    maps = write_gradcam(path, BLOCK0, tmp_path / "cam.h5")
    with probe.open(maps) as f:
        np.testing.assert_allclose(f[f"{BLOCK0}/gradcam"][:], gradcam(acts, grads), rtol=1e-5,
                                   atol=1e-7)


def test_new_weights_are_one_warning_line(make_cfg, folders, caplog):
    with caplog.at_level(logging.WARNING):
        _run(make_cfg, folders, "vit", "layernorm", "model.head=base", "limit=1")
    said = [r.getMessage() for r in caplog.records if "newly initialised" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "pooler" in said[0]
    assert "LOAD REPORT" not in caplog.text


def test_layers_lists_the_token_layout_and_patch_shapes(make_cfg, folders, tmp_path):
    from probe.pipeline.listing import layer_table
    from tests.tiny_vision import tiny_clip

    # the default dataset's 224 px images do not suit a 32 px ViT: its own example is listed
    notes, table = layer_table(make_cfg(
        "model=transformers", f"model.name={folders['dinov2']}", "tokens=patches"))
    rows = {row[0]: row for row in table}
    assert notes[0] == ("token layout: 21 tokens = 5 class/register token(s) + 4x4 patches; "
                        "tokens=patches stores (features, 4, 4)")
    assert notes[1].startswith("standard names of dinov2_with_registers (a run stores them "
                               "under these names): blocks.0-1;")
    assert rows["encoder.layer.1"][2] == "(32, 4, 4)"
    clip = tiny_clip(tmp_path / "clip")
    rows = {row[0]: row for row in layer_table(make_cfg(
        "model=transformers", f"model.name={clip}", "tokens=first"))[1]}
    assert rows["name"][-1] == "tower"
    assert rows["vision_model.encoder.layers.1"][2:] == ("(32,)", "128 B", "vision")
    assert rows["text_model.encoder.layers.1"][2:] == ("(12, 32)", "1.5 KiB", "text")


def test_patches_of_a_language_model_are_refused(make_cfg, tiny_lm, tmp_path):
    from tests.tiny_text import documents, write_jsonl

    docs = write_jsonl(tmp_path / "docs.jsonl", documents(3))
    with pytest.raises(ConfigError, match=r"tokens=patches on transformer.h.1/output, a token "
                                          r"layout of .* without a patch grid"):
        probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                           f"dataset.path={docs}", "layers=[transformer.h.1]",
                           "tokens=patches"))
