"""What probe stores equals an independent computation on the same weights and inputs:
torchvision's create_feature_extractor on a copy of the model with in-place ops switched off."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torchvision.models.feature_extraction import create_feature_extractor

import probe
from probe.data.images import SyntheticImages
from tests.conftest import hook_count, load_model, model_overrides

CASES = {
    "vgg16": ["features.0", "features.28", "features.30", "classifier.0", "classifier.6"],
    "resnet18": ["conv1", "layer1.0.conv1", "layer3.1", "layer4", "avgpool", "fc"],
}


def _images(n: int = 6, size: int = 32) -> torch.Tensor:
    dataset = SyntheticImages(num_samples=n, image_size=size, seed=0)
    return torch.stack([dataset[i][0] for i in range(n)])


def _expected(name: str, checkpoint, layers: list[str]) -> dict[str, np.ndarray]:
    model = load_model(name, checkpoint, inplace=False)
    extractor = create_feature_extractor(model, return_nodes=layers)
    with torch.no_grad():
        return {k: v.numpy() for k, v in extractor(_images()).items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_stores_what_the_model_computed(name, make_cfg, checkpoints, tmp_path):
    layers = CASES[name]
    cfg = make_cfg(*model_overrides(name, checkpoints[name]),
                   f"layers=[{','.join(layers)}]")
    path = probe.run(cfg)
    expected = _expected(name, checkpoints[name], layers)
    with h5py.File(path, "r") as f:  # plain h5py reads the file
        np.testing.assert_array_equal(f["index"][:], np.arange(6))
        for layer in layers:
            np.testing.assert_allclose(f[f"{layer}/output"][:], expected[layer],
                                       rtol=1e-5, atol=1e-5, err_msg=layer)


def test_vgg16_features_28_keeps_the_conv_output_before_the_inplace_relu(checkpoints):
    model = load_model("vgg16", checkpoints["vgg16"])  # ReLU(inplace=True) follows features.28
    expected = _expected("vgg16", checkpoints["vgg16"], ["features.28"])["features.28"]
    assert (expected < 0).any(), "the oracle must show negative conv outputs for this to test"
    with probe.attach(model, ["features.28"]) as cap, torch.inference_mode():
        model(_images())
        stored = cap["features.28/output"].numpy()
    np.testing.assert_allclose(stored, expected, rtol=1e-5, atol=1e-5)
    assert hook_count(model) == 0
