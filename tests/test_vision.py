"""Every vision model people probe: timm by name, each model's own preprocessing, modules that
run more than once per forward pass, and vision transformers' tokens. No downloads: random
inits, or seeded weights handed to the loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import probe
from probe.errors import ConfigError
from tests.conftest import load_model, model_overrides, no_h5_files, run_with

timm = pytest.importorskip("timm")

# a ViT as small as a test needs: 32 px images in 16 px patches, so 4 patches and a class token
VIT = ["model=timm", "model.name=vit_tiny_patch16_224", "+model.img_size=32",
       "dataset.image_size=32"]


def _images(n: int = 6, size: int = 32) -> torch.Tensor:
    from probe.data.images import SyntheticImages

    data = SyntheticImages(num_samples=n, image_size=size)
    return torch.stack([data[i][0] for i in range(n)])


def _vit() -> nn.Module:
    torch.manual_seed(0)  # as the runner seeds it: seed=0
    return timm.create_model("vit_tiny_patch16_224", img_size=32).eval()


def _hooked(model: nn.Module, layers: list[str], images: torch.Tensor) -> dict:
    """Plain forward hooks: every output of each layer, in call order (copies)."""
    seen: dict[str, list[torch.Tensor]] = {layer: [] for layer in layers}
    modules = dict(model.named_modules())
    handles = [modules[layer].register_forward_hook(
        lambda m, a, out, layer=layer: seen[layer].append(out.detach().clone()))
        for layer in layers]
    with torch.no_grad():
        model(images)
    for handle in handles:
        handle.remove()
    return seen


def test_timm_block_outputs_and_tokens_equal_plain_hooks(make_cfg, tmp_path):
    layers = ["blocks.0", "blocks.5", "norm"]
    want = _hooked(_vit(), layers, _images())
    full = probe.run(make_cfg(*VIT, f"layers=[{','.join(layers)}]"))
    with probe.open(full) as f:
        for layer in layers:
            assert f[f"{layer}/output"].shape == (6, 5, 192)
            np.testing.assert_allclose(f[f"{layer}/output"][:], want[layer][0].numpy(),
                                       rtol=1e-5, atol=1e-5, err_msg=layer)
    pooled = {"first": lambda t: t[:, 0], "mean": lambda t: t.mean(1)}
    for tokens, pool in pooled.items():
        path = probe.run(make_cfg(*VIT, "layers=[blocks.5]", f"tokens={tokens}",
                                  output=tmp_path / f"{tokens}.h5"))
        with probe.open(path) as f:
            assert f.attrs["tokens"] == tokens
            np.testing.assert_allclose(f["blocks.5/output"][:], pool(want["blocks.5"][0]).numpy(),
                                       rtol=1e-5, atol=1e-5)


def test_reduce_on_a_vit_block_is_refused_and_points_at_tokens(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"reduce=mean on blocks.5/output, a token layout.*"
                                          r"tokens=first"):
        probe.run(make_cfg(*VIT, "layers=[blocks.5]", "reduce=mean"))
    assert no_h5_files(tmp_path)
    # pooling the tokens is what works; the reduce then has nothing left to average
    path = probe.run(make_cfg(*VIT, "layers=[blocks.5]", "reduce=mean", "tokens=first"))
    with probe.open(path) as f:
        assert f["blocks.5/output"].shape == (6, 192)


def test_an_unknown_timm_name_suggests_close_ones(make_cfg):
    with pytest.raises(ConfigError, match="Did you mean vit_tiny_patch16_224"):
        probe.run(make_cfg("model=timm", "model.name=vit_tiny_patch16_244", "layers=[x]"))


def _pictures(root, sizes=((40, 30), (64, 80), (33, 33))) -> list:
    """Real image files of several sizes, in two classes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for n, (w, h) in enumerate(sizes * 2):
        folder = root / f"class{n % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{n}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return sorted(paths)


def test_timm_models_get_timms_own_preprocessing(make_cfg, tmp_path):
    from PIL import Image

    paths = _pictures(tmp_path / "pictures")
    path = probe.run(make_cfg("model=timm", "model.name=resnet18", "layers=[global_pool]",
                              "dataset=imagefolder", f"dataset.root={tmp_path / 'pictures'}"))
    torch.manual_seed(0)
    model = timm.create_model("resnet18").eval()
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
    images = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    want = _hooked(model, ["global_pool"], images)["global_pool"][0]
    with probe.open(path) as f:
        np.testing.assert_allclose(f["global_pool/output"][:], want.numpy(), rtol=1e-4,
                                   atol=1e-5)
        recorded = json.loads(f.attrs["transform"])
        config = timm.data.resolve_model_data_config(model)
        assert recorded["crop"] == list(config["input_size"][1:])
        assert recorded["interpolation"] == config["interpolation"]
        np.testing.assert_allclose(recorded["mean"], config["mean"], rtol=1e-6)


def test_named_torchvision_weights_bring_their_transforms(make_cfg, tmp_path, monkeypatch,
                                                          checkpoints):
    from PIL import Image
    from torchvision.models import ResNet18_Weights

    paths = _pictures(tmp_path / "pictures", sizes=((300, 260), (256, 300), (280, 280)))
    state = torch.load(checkpoints["resnet18"], weights_only=True)
    # the named weights' file, without a download: the seeded checkpoint stands in for it
    import torchvision.models._api

    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", lambda *a, **k: state)
    path = probe.run(make_cfg("model=resnet18", "model.weights=IMAGENET1K_V1", "layers=[avgpool]",
                              "dataset=imagefolder", f"dataset.root={tmp_path / 'pictures'}",
                              "batch_size=3"))
    transform = ResNet18_Weights.IMAGENET1K_V1.transforms()
    images = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    want = _hooked(load_model("resnet18", checkpoints["resnet18"]), ["avgpool"], images)
    with probe.open(path) as f:
        np.testing.assert_allclose(f["avgpool/output"][:], want["avgpool"][0].numpy(),
                                   rtol=1e-4, atol=1e-5)
        recorded = json.loads(f.attrs["transform"])
        assert (recorded["resize"], recorded["crop"]) == ([256], [224, 224])
    # transform=imagenet forces the ImageNet transform at dataset.image_size instead
    forced = probe.run(make_cfg("model=resnet18", "model.weights=IMAGENET1K_V1",
                                "layers=[avgpool]", "dataset=imagefolder",
                                f"dataset.root={tmp_path / 'pictures'}",
                                "dataset.transform=imagenet", "dataset.image_size=64",
                                output=tmp_path / "forced.h5"))
    with probe.open(forced) as f:
        assert json.loads(f.attrs["transform"])["crop"] == [64, 64]


def _reference_calls(checkpoint, hooks_on: str) -> tuple[list, list]:
    """Every output of ``hooks_on`` and d top1 / d each of them, on a model without in-place
    ops (so that each call's output is a tensor of its own)."""
    model = load_model("resnet18", checkpoint, inplace=False)
    outputs: list[torch.Tensor] = []
    module = dict(model.named_modules())[hooks_on]
    handle = module.register_forward_hook(lambda m, a, out: outputs.append(out))
    logits = model(_images())
    handle.remove()
    grads = torch.autograd.grad(logits.amax(1).sum(), outputs)
    return [o.detach() for o in outputs], list(grads)


def test_a_module_that_runs_twice_gives_both_runs_and_their_gradients(make_cfg, checkpoints):
    # resnet18's layer1.0.relu runs after bn1 and again after the residual sum, in place
    path = probe.run(make_cfg(*model_overrides("resnet18", checkpoints["resnet18"]),
                              "layers=[layer1.0.relu]", "hooks=[forward,backward]"))
    outputs, grads = _reference_calls(checkpoints["resnet18"], "layer1.0.relu")
    assert len(outputs) == 2
    with probe.open(path) as f:
        assert sorted(f.kinds("layer1.0.relu")) == ["grad_output", "grad_output_1", "output",
                                                    "output_1"]
        for call, suffix in ((0, ""), (1, "_1")):
            assert f[f"layer1.0.relu/output{suffix}"].attrs["call"] == call
            np.testing.assert_allclose(f[f"layer1.0.relu/output{suffix}"][:],
                                       outputs[call].numpy(), rtol=1e-5, atol=1e-5)
            want = grads[call].numpy()
            assert np.abs(want).max() > 0
            np.testing.assert_allclose(f[f"layer1.0.relu/grad_output{suffix}"][:], want,
                                       rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_early_stop_comes_after_the_last_run(make_cfg, tmp_path):
    model = load_model("resnet18", None)
    counts = {"fc": 0}
    model.fc.register_forward_hook(lambda *_: counts.__setitem__("fc", counts["fc"] + 1))
    early = run_with(make_cfg("model=resnet18", "layers=[layer1.0.relu,layer1.0.conv2]"),
                     model=model)
    assert counts["fc"] == 1  # only the dry run went through the whole model
    whole = probe.run(make_cfg("model=resnet18", "layers=[layer1.0.relu,layer1.0.conv2]",
                               "stop_early=false", output=tmp_path / "whole.h5"))
    with probe.open(early) as a, probe.open(whole) as b:
        for key in ("layer1.0.relu/output", "layer1.0.relu/output_1", "layer1.0.conv2/output"):
            np.testing.assert_array_equal(a[key][:], b[key][:])


class Varies(nn.Module):
    """``act`` runs once, or twice when the batch's sum is positive."""

    def __init__(self, *_, **__):
        super().__init__()
        self.act, self.head = nn.ReLU(), nn.Linear(3 * 32 * 32, 2)

    def forward(self, x):
        y = self.act(x)
        if x.sum() > 0:
            y = self.act(y - 1)
        return self.head(y.flatten(1))


@pytest.mark.parametrize("first, message", [
    (-1.0, "ran more than 1 time.*the same for every batch"),  # the dry run saw one run
    (1.0, "ran fewer times than in the first pass"),  # the dry run saw two
])
def test_runs_that_vary_between_batches_are_an_error(make_cfg, first, message):
    # sample 0 (the dry run's) decides; the next batch of 4 (one negative sample of four)
    # runs `act` twice, the one after (all negative) once
    data = [(torch.full((3, 32, 32), first if i == 0 else (1.0 if i < 4 else -1.0)), 0)
            for i in range(8)]
    cfg = make_cfg("model=custom", "model._target_=tests.test_vision.Varies", "layers=[act]",
                   "stop_early=false")  # an early stop would end the pass before a later run
    with pytest.raises(ConfigError, match=message):
        run_with(cfg, dataset=data)


def test_timm_vit_patches_lie_on_the_grid(make_cfg):
    want = _hooked(_vit(), ["blocks.5"], _images())["blocks.5"][0]  # (6, 1 + 2 x 2, 192)
    path = probe.run(make_cfg(*VIT, "layers=[blocks.5]", "tokens=patches"))
    with probe.open(path) as f:
        np.testing.assert_allclose(f["blocks.5/output"][:],
                                   want[:, 1:].reshape(6, 2, 2, 192).permute(0, 3, 1, 2).numpy(),
                                   rtol=1e-5, atol=1e-5)
