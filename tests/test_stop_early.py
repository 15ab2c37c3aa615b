"""Forward-only runs stop each pass after the last hooked module, with the same values."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import probe
import probe.runner
from probe.errors import ConfigError


@pytest.fixture
def calls(monkeypatch):
    """How often each named module of the built model ran, over the whole run."""
    counts: dict[str, int] = {}
    original = probe.runner.build

    def build(cfg, device):
        model, dataset = original(cfg, device)
        for name, module in model.named_modules():
            module.register_forward_hook(
                lambda *_, name=name: counts.__setitem__(name, counts.get(name, 0) + 1))
        return model, dataset

    monkeypatch.setattr(probe.runner, "build", build)
    return counts


def test_layers_after_the_last_hooked_one_do_not_run(make_cfg, calls, tmp_path):
    # vgg16 features.29 is the in-place ReLU that rewrites features.28's output
    layers = "layers=[features.28,features.29]"
    probe.run(make_cfg("model=vgg16", layers))
    # the one-sample dry run goes through the whole model; the two batches stop early
    assert calls["features.28"] == 3 and calls["features.30"] == 1 and calls["classifier"] == 1
    full = probe.run(make_cfg("model=vgg16", layers, "stop_early=false",
                              output=tmp_path / "full.h5"))
    assert calls["classifier"] == 1 + 3
    with h5py.File(tmp_path / "features.h5", "r") as early, h5py.File(full, "r") as whole:
        for key in ("features.28/output", "features.29/output"):
            np.testing.assert_array_equal(early[key][:], whole[key][:])
        assert (early["features.28/output"][:] < 0).any()
        assert (early["features.29/output"][:] >= 0).all()


def test_gradient_runs_never_stop_early(make_cfg, calls):
    probe.run(make_cfg("model=resnet18", "layers=[layer1]", "hooks=[forward,backward]"))
    assert calls["fc"] == 1 + 2


class Reuses(nn.Module):
    """``act`` runs twice, the second time after ``mid``: a stop after ``mid`` would hide it."""

    def __init__(self):
        super().__init__()
        self.act, self.mid = nn.ReLU(), nn.Linear(3, 3)

    def forward(self, x):
        return self.act(self.mid(self.act(x)))


def test_a_module_reused_after_the_stop_point_is_still_refused():
    model = Reuses()
    # the capture arms its early stop only after a complete pass, which meets the reuse
    with probe.Capture(model, ["act", "mid"], stop_early=True), torch.inference_mode():
        for _ in range(2):
            with pytest.raises(ConfigError, match="more than once"):
                model(torch.randn(2, 3))
