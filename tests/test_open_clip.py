"""model=open_clip with a small config of its own and a local state_dict: images run the vision
tower, pairs both towers with the gradients of each pair's matched logit, each equal to the
model run on one image or pair through open_clip's own preprocess and tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError
from tests.conftest import no_h5_files
from tests.tiny_vision import CAPTIONS, pictures, write_pairs

open_clip = pytest.importorskip("open_clip")

CONFIG = {"embed_dim": 16,
          "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8,
                         "head_width": 16},
          "text_cfg": {"context_length": 12, "vocab_size": 49408, "width": 32, "heads": 2,
                       "layers": 2}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("open-clip")
    config = root / "probe-tiny-clip.json"
    config.write_text(json.dumps(CONFIG))
    open_clip.add_model_config(config)
    torch.manual_seed(1)
    model = open_clip.create_model("probe-tiny-clip", pretrained_text=False)
    torch.save(model.state_dict(), root / "weights.pt")
    images = pictures(root / "images")
    return {"config": config, "weights": root / "weights.pt", "model": model.eval(),
            "images": root / "images", "files": images,
            "pairs": write_pairs(root / "pairs.jsonl", images)}


def _cfg(make_cfg, setup, *extra):
    return make_cfg("model=open_clip", f"model.name={setup['config']}",
                    f"model.weights={setup['weights']}", "batch_size=4", *extra)


def test_images_run_the_vision_tower(make_cfg, setup):
    from PIL import Image

    layer = "visual.transformer.resblocks.1"
    path = probe.run(_cfg(make_cfg, setup, "dataset=imagefolder",
                          f"dataset.root={setup['images']}", f"layers=[{layer},visual]",
                          "tokens=patches"))
    model = setup["model"]
    _, _, preprocess = open_clip.create_model_and_transforms("probe-tiny-clip")
    with probe.open(path) as f:
        patches, embedded = f[f"{layer}/output"][:], f["visual/output"][:]
    assert patches.shape == (6, 32, 4, 4) and embedded.shape == (6, 16)
    for n, file in enumerate(setup["files"]):
        seen = []
        handle = dict(model.named_modules())[layer].register_forward_hook(
            lambda m, a, out, seen=seen: seen.append(out.detach()))
        with torch.no_grad():
            want = model.encode_image(preprocess(Image.open(file).convert("RGB"))[None])
        handle.remove()
        np.testing.assert_allclose(patches[n], seen[0][0, 1:].T.reshape(32, 4, 4).numpy(),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(embedded[n], want[0].numpy(), rtol=1e-5, atol=1e-5)


def test_pairs_gradients_of_the_matched_logit(make_cfg, setup):
    from PIL import Image

    vision, text = "visual.transformer.resblocks.0", "transformer.resblocks.1"
    path = probe.run(_cfg(make_cfg, setup, "dataset=pairs", f"dataset.path={setup['pairs']}",
                          f"layers=[{vision},{text}]", "hooks=[forward,backward]",
                          "objective=similarity"))
    model = setup["model"]
    _, _, preprocess = open_clip.create_model_and_transforms("probe-tiny-clip")
    tokenizer = open_clip.get_tokenizer("probe-tiny-clip")
    modules = dict(model.named_modules())
    with probe.open(path) as f:
        grads = {name: f[f"{name}/grad_output"][:] for name in (vision, text)}
    for n, (file, caption) in enumerate(zip(setup["files"], CAPTIONS, strict=True)):
        seen = {}
        handles = [modules[name].register_forward_hook(
            lambda m, a, out, name=name, seen=seen: seen.setdefault(name, out))
            for name in (vision, text)]
        image, words, scale = model(preprocess(Image.open(file).convert("RGB"))[None],
                                    tokenizer([caption]))
        for handle in handles:
            handle.remove()
        logit = scale * (image * words).sum()  # the pair alone
        want = torch.autograd.grad(logit, [seen[vision], seen[text]])
        for name, grad in zip((vision, text), want, strict=True):
            assert np.abs(grads[name][n]).max() > 0
            np.testing.assert_allclose(grads[name][n], grad[0].numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{name} pair {n}")


def test_a_text_layer_with_images_and_an_unknown_name_are_one_line(make_cfg, setup, tmp_path):
    with pytest.raises(ConfigError, match=r"layer transformer.resblocks.0 is in the text tower"):
        probe.run(_cfg(make_cfg, setup, "dataset=imagefolder", f"dataset.root={setup['images']}",
                       "layers=[transformer.resblocks.0]"))
    with pytest.raises(ConfigError, match=r"not an open_clip architecture. Did you mean ViT-B-32"):
        probe.run(make_cfg("model=open_clip", "model.name=ViT-B-23", "layers=[visual]"))
    assert no_h5_files(tmp_path)


def test_layers_lists_both_towers(make_cfg, setup):
    from probe.pipeline.listing import layer_table

    notes, table = layer_table(_cfg(make_cfg, setup, "tokens=patches"))
    rows = {row[0]: row for row in table}
    assert notes and "4x4 patches" in notes[0]
    assert rows["visual.transformer.resblocks.1"][2:] == ("(32, 4, 4)", "2.0 KiB", "vision")
    assert rows["transformer.resblocks.1"][2:] == ("(12, 32)", "1.5 KiB", "text")
