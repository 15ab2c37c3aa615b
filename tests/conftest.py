"""Shared helpers: the real config composed with tiny inputs, seeded models, a CLI runner, the
one-line error check, and ways to interrupt a run."""

from __future__ import annotations

import atexit
import copy
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torchvision
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from torch import nn

import probe
import probe.file.writer
from probe.config import CONFIG_DIR
from probe.config.compose import compose
from tests.cli import cli  # noqa: F401  (shared with the test modules)
from tests.tiny import PacedImages, TinyNet  # noqa: F401  (shared with the test modules)

REPO = Path(__file__).resolve().parent.parent

# Hugging Face libraries read these at import: any download must fail loudly, and nothing may
# be written to the user's cache
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="probe-tests-hf-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)

# Each xdist worker computes on one thread (its subprocesses too): two workers of two threads
# each on two cores would wait on each other's spinning OpenMP threads
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """PROBE_SLURM_TESTS=1 is enough to run the SLURM tests: they are slow, which the default
    -m leaves out, so the variable adds them to whatever -m selects (before pytest applies it)."""
    if os.environ.get("PROBE_SLURM_TESTS") == "1" and config.option.markexpr:
        config.option.markexpr = f"({config.option.markexpr}) or slurm"


# Small enough for 2 CPU cores: 32 px images, a handful of samples.
TINY = ["dataset.image_size=32", "dataset.num_samples=6", "batch_size=4"]
# A model for the command line that imports in a second less than a torchvision one
TINY_NET = ["model=custom", "model._target_=tests.tiny.TinyNet"]


@pytest.fixture
def one_thread(monkeypatch):
    """Torch and the commands' processes on one thread: the analyses' small matrices gain
    nothing from threads, which only wait on each other on a busy machine. A module takes it
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the same for a command's own process
    yield
    torch.set_num_threads(threads)


def compose_cfg(*overrides: str, output: Path | None = None, tiny: bool = True):
    """conf/config.yaml composed with ``overrides`` (after TINY, unless another dataset is
    picked or ``tiny`` is false) and ``output.path=output`` unless an override sets it."""
    base = TINY if tiny and not any(o.startswith("dataset=") for o in overrides) else []
    cfg = compose_command("config", *base, *overrides)
    if output is not None and not any(o.startswith("output.path=") for o in overrides):
        cfg.output.path = str(output)
    return cfg


def compose_command(name: str, *overrides: str, schema: type | None = None):
    """conf/<name>.yaml composed with ``overrides``, as probe.config.compose composes it (see
    _composed)."""
    groups = tuple(o for o in overrides if _is_group_override(o))
    cfg = copy.deepcopy(_composed(name, schema, groups))
    values = [_parsed(o) for o in overrides if not _is_group_override(o)]
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    return cfg


# Hydra takes a good part of a second to compose a config, most of it making the defaults
# list: a test's config is Hydra's composition of its group choices (model=, dataset=), made
# once per session, with its other overrides applied by Hydra's own function, as Hydra
# applies them after composing; each caller gets a copy of its own
@functools.cache
def _composed(name: str, schema: type | None, groups: tuple[str, ...]):
    return compose(list(groups), name=name, schema=schema)


@functools.cache
def _parsed(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([override])[0]


def _is_group_override(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return "/" in key or (CONFIG_DIR / key).is_dir()


@pytest.fixture
def make_cfg(tmp_path):
    """compose_cfg with the output at tmp_path/features.h5 unless ``output`` says otherwise."""

    def make(*overrides: str, output: Path | None = None):
        return compose_cfg(*overrides, output=output or tmp_path / "features.h5")

    return make


def run_with(cfg, *, model: nn.Module | None = None, dataset=None) -> Path:
    """``probe.run(cfg)`` with this model or dataset instead of the config's."""
    return probe.execute(probe.plan(cfg, model=model, dataset=dataset))


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    """A 2-block GPT-2, 32 wide, and its tokenizer, saved in a folder (model.name=<it>)."""
    from tests.tiny_text import tiny_gpt2

    return tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


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
    """Weights the runner and an oracle share. vgg16 has no batch norm, so its seeded random
    init (model.weights=null, seed=0) is used as it is, without writing 528 MB."""
    directory = tmp_path_factory.mktemp("checkpoints")
    return {"resnet18": seeded_checkpoint(directory, "resnet18"), "vgg16": None}


def model_overrides(name: str, checkpoint: Path | None) -> list[str]:
    """The overrides that make the runner build ``load_model(name, checkpoint)``."""
    weights = [f"model.weights={checkpoint}"] if checkpoint is not None else ["seed=0"]
    return [f"model={name}", *weights]


def load_model(name: str, checkpoint: Path | None, inplace: bool = True) -> nn.Module:
    """The checkpoint's model (or the seed-0 random init) in eval mode, a copy of its own;
    with ``inplace=False`` every in-place op is off."""
    model = copy.deepcopy(_loaded(name, checkpoint))
    if not inplace:
        for module in model.modules():
            if hasattr(module, "inplace"):
                module.inplace = False
    return model


@functools.cache
def _loaded(name: str, checkpoint: Path | None) -> nn.Module:
    # built once per session (vgg16 takes seconds to initialise); callers get copies
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model.eval()


def run_cli(*args: str, cwd: Path, module: str = "probe", **env: str
            ) -> subprocess.CompletedProcess:
    """``python -m <module> ARGS`` in a fresh process, from ``cwd``, for tests whose subject
    is the process (what else: tests.cli.cli, in this one); ``tests`` is importable there, for
    configs that name a test module's ``_target_``. The timeout is for a hang only."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)


def error_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    """The one ``probe: error:`` line of a command that failed as a user error should: with
    ``status``, no traceback, no other error line."""
    assert result.returncode == status, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("probe: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


def interrupt_after(monkeypatch, batches: int) -> None:
    """Make the run's writer raise KeyboardInterrupt when it is handed batch ``batches + 1``,
    as a Ctrl-C between batches would (the first ``batches`` are kept)."""
    calls = []
    original = probe.file.writer.BackgroundWriter.put

    def put(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > batches:
            monkeypatch.undo()
            raise KeyboardInterrupt
        original(self, *args, **kwargs)

    monkeypatch.setattr(probe.file.writer.BackgroundWriter, "put", put)


def no_h5_files(directory: Path) -> bool:
    """Whether no probe file, finished or partial, lies anywhere under ``directory``."""
    return not list(directory.rglob("*.h5*"))


def assert_same_datasets(a: Path, b: Path, keys: Iterable[str],
                         skip_attrs: Iterable[str] = ()) -> None:
    """The datasets ``keys`` of two HDF5 files hold the same values and attrs (less
    ``skip_attrs``; a NaN in a float attr equals a NaN)."""
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        for key in keys:
            np.testing.assert_array_equal(x[key][:], y[key][:], err_msg=key)
            assert x[key].attrs.keys() == y[key].attrs.keys(), key
            for name, value in x[key].attrs.items():  # lists of names come back as arrays
                if name in skip_attrs:
                    continue
                floats = np.asarray(value).dtype.kind == "f"
                assert np.array_equal(value, y[key].attrs[name], equal_nan=floats), (key, name)


def hook_count(model: nn.Module) -> int:
    """Every forward, pre-forward and backward hook left on any module of ``model``."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(m._backward_pre_hooks) for m in model.modules())
