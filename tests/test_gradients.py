"""Gradients: oracle tests against torch.autograd.grad on a copy of the model with in-place ops
off, batch independence, and the errors a gradient run can meet."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

import probe
from probe.data.images import SyntheticImages
from probe.errors import ConfigError
from tests.conftest import hook_count, load_model, model_overrides, no_h5_files, run_with

CASES = {
    # features.28 is followed by ReLU(inplace=True); classifier.3 by ReLU(inplace) and Dropout
    "vgg16": ["features.0", "features.28", "classifier.3"],
    # layer3.1.bn2's output is rewritten by `out += identity`; layer3.1 and layer4 are blocks
    "resnet18": ["layer3.1.conv1", "layer3.1.bn2", "layer3.1", "layer4"],
}


def _images(n: int = 6, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    dataset = SyntheticImages(num_samples=n, image_size=size, seed=0)
    items = [dataset[i] for i in range(n)]
    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def _oracle(name, checkpoint, layers, objective, batch_size: int = 4):
    """d objective / d each layer's output and first input, on a model without in-place ops,
    in the run's batches (TINY's batch_size: a batch of another size rounds otherwise)."""
    model = load_model(name, checkpoint, inplace=False)
    modules = dict(model.named_modules())
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for layer in layers:
        handles.append(modules[layer].register_forward_pre_hook(
            lambda m, args, layer=layer: seen.__setitem__(f"{layer}/grad_input", args[0])))
        handles.append(modules[layer].register_forward_hook(
            lambda m, args, out, layer=layer: seen.__setitem__(f"{layer}/grad_output", out)))
    all_images, all_targets = _images()
    found: dict[str, list] = {}
    for start in range(0, len(all_images), batch_size):
        images = all_images[start:start + batch_size].requires_grad_(True)
        targets = all_targets[start:start + batch_size]
        logits = model(images)
        rows = torch.arange(len(logits))
        chosen = logits.argmax(1) if objective == "top1" else targets
        keys = sorted(seen)
        grads = torch.autograd.grad(logits[rows, chosen].sum(), [seen[k] for k in keys])
        for key, grad in zip(keys, grads, strict=True):
            found.setdefault(key, []).append(grad.numpy())
    for handle in handles:
        handle.remove()
    return {key: np.concatenate(parts) for key, parts in found.items()}


@pytest.mark.parametrize("objective", ["top1", "target"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_equal_autograd_on_a_model_without_inplace_ops(name, objective, make_cfg,
                                                                  checkpoints):
    layers = CASES[name]
    cfg = make_cfg(*model_overrides(name, checkpoints[name]),
                   f"layers=[{','.join(layers)}]", "hooks=[backward,backward_input]",
                   f"objective={objective}")
    path = run_with(cfg, model=load_model(name, checkpoints[name]))  # the weights of the config
    expected = _oracle(name, checkpoints[name], layers, objective)
    with h5py.File(path, "r") as f:
        assert f.attrs["objective"] == objective
        for key, want in expected.items():
            got = f[key][:]
            assert np.abs(want).max() > 0, key
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max(),
                                       err_msg=key)


def test_features_28_gradient_is_taken_before_the_inplace_relu(checkpoints):
    """d objective / d conv output is zero wherever the conv output was negative (the ReLU
    blocks it there). The naive way, autograd.grad at a kept reference of the output, gives
    the gradient after the in-place ReLU instead, which is not zero there."""
    model = load_model("vgg16", checkpoints["vgg16"])
    images, _ = _images()
    kept = []
    naive = model.features[28].register_forward_hook(lambda m, a, out: kept.append(out))
    with probe.attach(model, ["features.28"], ["forward", "backward"]) as cap:
        logits = model(images.requires_grad_(True))
        objective = logits.amax(1).sum()
        (naive_grad,) = torch.autograd.grad(objective, kept, retain_graph=True)
        cap.backward(objective)
        conv, grad = cap["features.28/output"], cap["features.28/grad_output"]
    naive.remove()
    negative = conv < 0
    assert negative.any() and (naive_grad[negative] != 0).any()
    assert (grad[negative] == 0).all() and (grad[~negative] == naive_grad[~negative]).all()
    assert hook_count(model) == 0


def test_saliency_is_the_gradient_at_the_image(make_cfg, checkpoints):
    cfg = make_cfg(*model_overrides("resnet18", checkpoints["resnet18"]),
                   "layers=[conv1]", "hooks=[backward_input]")
    with probe.open(probe.run(cfg)) as f:
        saliency = f["conv1/grad_input"][:]
    model = load_model("resnet18", checkpoints["resnet18"], inplace=False)
    images, _ = _images()
    images.requires_grad_(True)
    logits = model(images)
    (want,) = torch.autograd.grad(logits.amax(1).sum(), images)
    assert saliency.shape == (6, 3, 32, 32)
    np.testing.assert_allclose(saliency, want.numpy(), rtol=1e-4, atol=1e-7)


def test_rows_do_not_depend_on_their_batch(make_cfg, tmp_path):
    files = [probe.run(make_cfg("model=resnet18", "layers=[layer4]", "hooks=[forward,backward]",
                                f"batch_size={size}", output=tmp_path / f"b{size}.h5"))
             for size in (1, 4)]
    with h5py.File(files[0], "r") as one, h5py.File(files[1], "r") as four:
        for key in ("layer4/output", "layer4/grad_output"):
            # equal up to float32 rounding (conv kernels differ by batch size); a leak between
            # rows (a mean over the batch, batch statistics) would be far larger
            a, b = one[key][:], four[key][:]
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5 * np.abs(b).max())


def _resnet18() -> nn.Module:
    return load_model("resnet18", None)


def test_the_model_is_left_as_found(make_cfg):
    model = _resnet18()
    run_with(make_cfg("model=resnet18", "layers=[layer4,fc]", "hooks=[forward,backward]"),
             model=model)
    assert hook_count(model) == 0 and not model.training
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_no_hooks_remain_after_a_gradient_run_that_raises(make_cfg):
    model = _resnet18()
    cfg = make_cfg("model=resnet18", "layers=[fc]", "hooks=[backward]",
                   "objective={_target_: tests.test_gradients.whole_batch}")
    with pytest.raises(ConfigError, match=r"one value per sample, shape \(1,\)"):
        run_with(cfg, model=model)
    assert hook_count(model) == 0
    assert all(p.requires_grad for p in model.parameters())


def test_forward_only_runs_in_inference_mode(make_cfg):
    modes = []
    model = _resnet18()
    model.fc.register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    run_with(make_cfg("model=resnet18", "layers=[fc]"), model=model)
    run_with(make_cfg("model=resnet18", "layers=[fc]", "hooks=[backward]",
                      "output.overwrite=true"), model=model)
    # each run: the one-sample size estimate (always inference mode), then two batches
    assert modes == [True, True, True] + [True, False, False]


def whole_batch(output, targets):
    """A wrong objective: one scalar for the whole batch."""
    return output.sum()


def per_sample_norm(output, targets):
    return output.norm(dim=1)


def test_a_callable_objective(make_cfg, checkpoints):
    cfg = make_cfg(*model_overrides("resnet18", checkpoints["resnet18"]), "layers=[fc]",
                   "hooks=[backward]", "objective={_target_: tests.test_gradients.per_sample_norm}")
    with probe.open(probe.run(cfg)) as f:
        got = f["fc/grad_output"][:]
        assert f.attrs["objective"] == "tests.test_gradients.per_sample_norm"
    model = load_model("resnet18", checkpoints["resnet18"], inplace=False)
    logits = model(_images()[0])
    np.testing.assert_allclose(got, (logits / logits.norm(dim=1, keepdim=True)).detach().numpy(),
                               rtol=1e-5, atol=1e-7)


class DeadEnd(nn.Module):
    """A model with a branch that the output does not use."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 5)

    def forward(self, x):
        self.unused(x)
        return self.head(self.used(x).mean((2, 3)))


def test_a_layer_the_objective_does_not_depend_on(make_cfg, tmp_path):
    cfg = make_cfg("layers=[unused]", "hooks=[backward]")
    cfg.model = OmegaConf.create({"_target_": "tests.test_gradients.DeadEnd"})
    with pytest.raises(ConfigError, match="does not depend on 'unused'"):
        probe.run(cfg)
    assert no_h5_files(tmp_path)


def test_target_objective_needs_targets(make_cfg, tmp_path):
    cfg = make_cfg("model=resnet18", "layers=[fc]", "hooks=[backward]", "objective=target")
    cfg.dataset = OmegaConf.create({"_target_": "torch.utils.data.TensorDataset",
                                    "_args_": [{"_target_": "torch.zeros",
                                                "_args_": [2, 3, 32, 32]}]})
    with pytest.raises(ConfigError, match="no targets"):
        probe.run(cfg)
    assert no_h5_files(tmp_path)


def test_wrong_objective_shape_leaves_no_file(make_cfg, tmp_path):
    cfg = make_cfg("model=resnet18", "layers=[fc]", "hooks=[backward]",
                   "objective={_target_: tests.test_gradients.whole_batch}")
    with pytest.raises(ConfigError, match="one value per sample"):
        probe.run(cfg)
    assert no_h5_files(tmp_path)


def test_unknown_objective(make_cfg):
    with pytest.raises(ConfigError, match="objective='top5'"):
        probe.run(make_cfg("model=resnet18", "layers=[fc]", "hooks=[backward]",
                           "objective=top5"))


class TupleOut(nn.Module):
    def forward(self, x):
        return x * 2, x


def test_tuple_outputs_use_the_first_tensor_and_say_so():
    model = nn.Sequential(nn.Linear(3, 3), TupleOut())
    x = torch.randn(2, 3, requires_grad=True)
    with probe.attach(model, ["1"], ["forward", "backward"]) as cap:
        out, _ = model(x)
        cap.backward(out.sum())
        assert torch.equal(cap["1/grad_output"], torch.ones(2, 3))
        assert cap.attrs("1/grad_output")["tuple_position"] == 0
