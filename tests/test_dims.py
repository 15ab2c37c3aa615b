"""Every stored dataset names its axes (attr ``dims``) by what the layer returns: channels and
space from convolutions, tokens and features from transformers, whether or not the tokens are
the batch's row layout."""

from __future__ import annotations

import h5py
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import probe
from tests.conftest import TINY_NET, run_with
from tests.tiny_vision import pictures, tiny_clip, tiny_vit, write_pairs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dims")
    images = pictures(root / "images")
    return {"clip": tiny_clip(root / "clip"), "vit": tiny_vit(root / "vit"),
            "pairs": write_pairs(root / "pairs.csv", images), "images": root / "images"}


def _dims(path) -> dict[str, list[str]]:
    names: list[str] = []
    with h5py.File(path, "r") as f:
        f.visit(names.append)
        return {name: [str(d) for d in f[name].attrs["dims"]] for name in names
                if isinstance(f[name], h5py.Dataset) and "/" in name}


def test_a_convolutional_model_stores_channels_then_space(make_cfg):
    path = probe.run(make_cfg(*TINY_NET, "layers=[features.3,pool,fc]"))
    assert _dims(path) == {"features.3/output": ["sample", "channel", "height", "width"],
                           "pool/output": ["sample", "channel", "height", "width"],
                           "fc/output": ["sample", "feature"]}


def test_a_one_dimensional_convolution_stores_channels_then_length(make_cfg):
    model = nn.Sequential(nn.Conv1d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
    data = TensorDataset(torch.randn(3, 3, 10), torch.zeros(3, dtype=torch.int64))
    path = run_with(make_cfg("layers=[0,3]"), model=model, dataset=data)
    assert _dims(path) == {"0/output": ["sample", "channel", "length"],
                           "3/output": ["sample", "feature"]}


def test_token_outputs_outside_the_row_layout_are_tokens_then_features(make_cfg, models):
    """A ViT's patch embedding (tokens=first pools the blocks' outputs, not it) and the text
    tower of a pairs run (stored whole, per sample)."""
    vit = probe.run(make_cfg("model=transformers", f"model.name={models['vit']}",
                             "dataset=imagefolder", f"dataset.root={models['images']}",
                             "dataset.image_size=32", "tokens=first",
                             "layers=[vit.embeddings.patch_embeddings,vit.layers.0]",
                             output=models["images"].parent / "vit.h5"))
    assert _dims(vit) == {"vit.embeddings.patch_embeddings/output": ["sample", "token", "feature"],
                          "vit.layers.0/output": ["sample", "feature"]}
    pairs = probe.run(make_cfg("model=transformers", f"model.name={models['clip']}",
                               "dataset=pairs", f"dataset.path={models['pairs']}",
                               "layers=[text_model.encoder.layers.1,vision_model.encoder.layers.0]",
                               output=models["images"].parent / "pairs.h5"))
    dims = _dims(pairs)
    assert dims["text_model.encoder.layers.1/output"] == ["sample", "token", "feature"]
    assert dims["vision_model.encoder.layers.0/output"] == ["sample", "token", "feature"]
