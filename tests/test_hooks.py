"""probe.attach: hooks live exactly as long as the with block; copies are taken at hook time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probe
from probe.errors import ConfigError
from tests.conftest import hook_count


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))


def test_captures_output_and_input_inside_the_block():
    model, x = _net(), torch.randn(2, 3, 8, 8)
    with probe.attach(model, ["0", "3"], hooks=["forward", "forward_pre"]) as cap:
        out = model(x)
        assert torch.equal(cap["0/input"], x)
        assert torch.equal(cap["3/output"], out)
        assert (cap["0/output"] < 0).any()  # taken before the in-place ReLU ran
    assert hook_count(model) == 0


def test_hooks_are_removed_when_the_block_raises():
    model = _net()
    with pytest.raises(RuntimeError, match="boom"), probe.attach(model, ["0", "1", "3"]):
        assert hook_count(model) > 0
        raise RuntimeError("boom")
    assert hook_count(model) == 0


def test_hooks_are_removed_when_the_forward_raises():
    model = _net()
    with pytest.raises(RuntimeError), probe.attach(model, ["0"]):
        model(torch.randn(2, 5, 8, 8))  # wrong channel count
    assert hook_count(model) == 0


def test_globs_resolve_in_module_order():
    with probe.attach(_net(), ["[30]", "1"]) as cap:
        assert cap.layers == ["0", "1", "3"]


def test_a_module_run_twice_in_one_forward_gives_both_runs():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
    x = torch.randn(2, 3)
    with probe.attach(model, ["1"]) as cap:
        out = model(x)
        assert torch.equal(cap["1/output"], model[0](x).relu())
        assert torch.equal(cap["1/output_1"], out)
        cap.take()  # the first complete pass tells how often each module runs
        assert cap.calls == {"1": 2} and cap.attrs("1/output_1")["call"] == 1
    assert hook_count(model) == 0


def test_take_names_a_module_that_did_not_run():
    class Skips(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    model = Skips()
    with probe.attach(model, ["used", "unused"]) as cap:
        model(torch.randn(2, 3))
        with pytest.raises(ConfigError, match="nothing was captured for unused: the module did "
                                              "not run"):
            cap.take()


def test_each_forward_replaces_the_last_values():
    model = _net()
    with probe.attach(model, ["3"]) as cap:
        first = model(torch.randn(2, 3, 8, 8))
        second = model(torch.randn(2, 3, 8, 8))
        assert torch.equal(cap["3/output"], second) and not torch.equal(first, second)


def test_mode_and_flags_are_left_as_they_were():
    model = _net().train()
    with probe.attach(model, ["0"], hooks=["forward", "backward"]) as cap:
        out = model(torch.randn(2, 3, 8, 8))
        cap.backward(out.sum())
    assert model.training and all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("bad", [["nope"], []])
def test_unknown_and_empty_hooks_are_errors(bad):
    with pytest.raises(ConfigError, match="hook"):
        probe.attach(_net(), ["0"], hooks=bad)


def test_reduce_mean_max_flatten():
    model, x = _net(), torch.randn(2, 3, 8, 8)
    expected = {"mean": lambda t: t.mean((2, 3)), "max": lambda t: t.amax((2, 3)),
                "flatten": lambda t: t.flatten(1)}
    with probe.attach(model, ["0"]) as full:
        model(x)
    for how, fn in expected.items():
        with probe.attach(model, ["0"], reduce=how) as cap:
            model(x)
            torch.testing.assert_close(cap["0/output"], fn(full["0/output"]))


def test_reduce_by_layer_overrides_the_default_per_layer():
    model, x = _net(), torch.randn(2, 3, 8, 8)
    with probe.attach(model, ["0", "3"]) as full:
        model(x)
    with probe.attach(model, ["*"], reduce="mean", reduce_by_layer={"0": "none", "[0-2]": "max"}
                      ) as cap:
        model(x)
        assert torch.equal(cap["0/output"], full["0/output"])  # its own name beats a glob
        torch.testing.assert_close(cap["1/output"], full["0/output"].relu().amax((2, 3)))
        assert torch.equal(cap["3/output"], full["3/output"])  # (N, C): nothing to reduce
        assert cap.attrs("0/output")["reduce"] == "none"
        assert cap.attrs("1/output")["reduce"] == "max"
        assert cap.attrs("3/output")["reduce"] == "mean"


@pytest.mark.parametrize("overrides, message", [
    ({"4": "none"}, "matches none of the layers"),
    ({"0": "avg"}, "avg"),
    ("mean", "not a mapping"),
    ({"[0-1]": "max", "?": "mean"}, "different reduces"),  # unordered: globs must agree
    ({"0": {"1": "none"}}, "inside braces"),  # what +reduce_by_layer.0.1=none composes to
])
def test_reduce_by_layer_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        probe.attach(_net(), ["0", "3"], reduce_by_layer=overrides)


def test_float16_copies():
    model = _net()
    with probe.attach(model, ["0"], dtype=torch.float16) as cap:
        model(torch.randn(2, 3, 8, 8))
        assert cap["0/output"].dtype == torch.float16
