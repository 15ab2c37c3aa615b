"""Shared fixtures: the real config composed with tiny inputs, seeded checkpoints, a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torchvision
from hydra import compose, initialize_config_dir
from torch import nn

from probe.config import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent

# Small enough for 2 CPU cores: 32 px images, a handful of samples.
TINY = ["dataset.image_size=32", "dataset.num_samples=6", "batch_size=4"]


@pytest.fixture
def make_cfg(tmp_path):
    """Compose conf/config.yaml with tiny inputs and the output under tmp_path."""

    def make(*overrides: str, output: Path | None = None):
        path = output or tmp_path / "features.h5"
        tiny = TINY
        if any(o.startswith("dataset=") for o in overrides):  # other datasets have other keys
            tiny = [o for o in TINY if not o.startswith("dataset.")]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return compose("config", [*tiny, f"output.path={path}", *overrides])

    return make


def seeded_checkpoint(directory: Path, name: str, seed: int = 0) -> Path:
    """A torchvision model with seeded random weights and randomised BN statistics, saved as a
    state_dict: the runner and an oracle can then load the very same weights."""
    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):  # eval-mode BN should not be the identity
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    path = directory / f"{name}-{seed}.pt"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    directory = tmp_path_factory.mktemp("checkpoints")
    return {name: seeded_checkpoint(directory, name) for name in ("vgg16", "resnet18")}


def load_model(name: str, checkpoint: Path, inplace: bool = True) -> nn.Module:
    """The checkpoint's model in eval mode; with ``inplace=False`` every in-place op is off."""
    model = torchvision.models.get_model(name, weights=None)
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    if not inplace:
        for module in model.modules():
            if hasattr(module, "inplace"):
                module.inplace = False
    return model.eval()


def run_cli(*args: str, cwd: Path, module: str = "probe") -> subprocess.CompletedProcess:
    """``python -m <module> ARGS`` in a fresh process, from ``cwd``."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def no_h5_files(directory: Path) -> bool:
    """Whether no probe file, finished or partial, lies anywhere under ``directory``."""
    return not list(directory.rglob("*.h5*"))


def assert_same_datasets(a: Path, b: Path, keys: Iterable[str]) -> None:
    """The datasets ``keys`` of two HDF5 files hold the same values and attrs."""
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        for key in keys:
            np.testing.assert_array_equal(x[key][:], y[key][:], err_msg=key)
            assert dict(x[key].attrs) == dict(y[key].attrs), key


def hook_count(model: nn.Module) -> int:
    """Every forward, pre-forward and backward hook left on any module of ``model``."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())
