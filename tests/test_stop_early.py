"""Forward-only runs stop each pass after the last hooked module, with the same values."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import probe
from tests.conftest import load_model, run_with


def _counted(name: str) -> tuple[nn.Module, dict[str, int]]:
    """A seeded torchvision model, and how often each of its named modules ran."""
    model = load_model(name, None)
    counts: dict[str, int] = {}
    for module_name, module in model.named_modules():
        module.register_forward_hook(
            lambda *_, n=module_name: counts.__setitem__(n, counts.get(n, 0) + 1))
    return model, counts


def test_layers_after_the_last_hooked_one_do_not_run(make_cfg, tmp_path):
    # vgg16 features.29 is the in-place ReLU that rewrites features.28's output
    layers = "layers=[features.28,features.29]"
    model, calls = _counted("vgg16")
    run_with(make_cfg("model=vgg16", layers), model=model)
    # the one-sample dry run goes through the whole model; the two batches stop early
    assert calls["features.28"] == 3 and calls["features.30"] == 1 and calls["classifier"] == 1
    full = run_with(make_cfg("model=vgg16", layers, "stop_early=false",
                             output=tmp_path / "full.h5"), model=model)
    assert calls["classifier"] == 1 + 3
    with h5py.File(tmp_path / "features.h5", "r") as early, h5py.File(full, "r") as whole:
        for key in ("features.28/output", "features.29/output"):
            np.testing.assert_array_equal(early[key][:], whole[key][:])
        assert (early["features.28/output"][:] < 0).any()
        assert (early["features.29/output"][:] >= 0).all()


def test_gradient_runs_never_stop_early(make_cfg):
    model, calls = _counted("resnet18")
    run_with(make_cfg("model=resnet18", "layers=[layer1]", "hooks=[forward,backward]"),
             model=model)
    assert calls["fc"] == 1 + 2


class Reuses(nn.Module):
    """``act`` runs twice, the second time after ``mid``: a stop after ``mid`` would hide it."""

    def __init__(self):
        super().__init__()
        self.act, self.mid = nn.ReLU(), nn.Linear(3, 3)

    def forward(self, x):
        return self.act(self.mid(self.act(x)))


def test_a_module_reused_after_the_stop_point_is_still_captured():
    model, x = Reuses(), torch.randn(2, 3)
    # the capture learns the runs from a complete pass, then stops after the last of them
    with probe.Capture(model, ["act", "mid"], stop_early=True) as cap, torch.inference_mode():
        model(x)
        first = cap.take()
        with pytest.raises(probe.pipeline.hooks.StopForward):
            model(x)
        second = cap.take()
    assert list(first) == ["act/output", "act/output_1", "mid/output"]
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert torch.equal(first["act/output_1"], model(x))
