"""The config schema, checked by Hydra when a config is composed.

Values live in ``conf/`` (YAML groups); this file only says which keys exist and their types, so
that a mistyped key or a value of the wrong type fails at composition with Hydra's own message.
``register_configs()`` puts the schema in Hydra's ConfigStore as ``probe_schema``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

__all__ = [
    "CONFIG_DIR",
    "Hook",
    "Reduce",
    "Dtype",
    "Compression",
    "ProbeConfig",
    "option_name",
    "register_configs",
]


def _config_dir() -> Path:
    # A wheel ships the configs as probe/conf; a source checkout keeps them at the top level.
    packaged = Path(__file__).resolve().parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "conf"


CONFIG_DIR = _config_dir()


class Hook(str, Enum):
    """What a hook captures, and the dataset it writes under ``<layer>/``."""

    forward = "output"
    forward_pre = "input"
    backward = "grad_output"
    backward_input = "grad_input"

    @property
    def kind(self) -> str:
        return self.value

    @property
    def needs_grad(self) -> bool:
        return self in (Hook.backward, Hook.backward_input)


class Reduce(str, Enum):
    """How a captured (N, C, ...) tensor is reduced before it is stored."""

    none = "none"
    mean = "mean"
    max = "max"
    flatten = "flatten"


class Dtype(str, Enum):
    float32 = "float32"
    float16 = "float16"


class Compression(str, Enum):
    none = "none"
    lzf = "lzf"
    gzip = "gzip"
    zstd = "zstd"


@dataclass
class ShardConfig:
    # this job takes every sample i (after `limit`) with i % count == index
    index: int = 0
    count: int = 1


@dataclass
class OutputConfig:
    # the HDF5 file; null means <Hydra run dir>/features.h5
    path: str | None = None
    # replace a file that holds another config's run (otherwise such a file is refused)
    overwrite: bool = False
    # stored element type
    dtype: Dtype = Dtype.float32
    # HDF5 filter; zstd needs the `zstd` extra (hdf5plugin)
    compression: Compression = Compression.none
    # gzip level 0-9 or zstd level 1-22; null means the filter's default
    compression_level: int | None = None
    # rows become durable (resumable after a crash) every this many batches or seconds
    commit_every: int = 8
    commit_seconds: float = 5.0
    # refuse to start a run whose estimated size exceeds the free disk space
    check_free_space: bool = True
    # HDF5 file locking: null (HDF5's default, or HDF5_USE_FILE_LOCKING), true, false, or
    # best-effort; false or best-effort on file systems where locking fails (some NFS mounts)
    file_locking: Any = None


@dataclass
class ProbeConfig:
    # `_target_` of a torch.nn.Module factory; see conf/model/
    model: Any = MISSING
    # `_target_` of a torch Dataset whose items are a tensor or (tensor, target); see conf/dataset/
    dataset: Any = MISSING
    # module paths as model.named_modules() names them; shell-style globs allowed
    layers: list[str] = field(default_factory=list)
    # what to capture at each layer
    hooks: list[Hook] = field(default_factory=lambda: [Hook.forward])
    # the scalar per sample that backward hooks differentiate: top1, target or a `_target_`
    objective: Any = "top1"
    # reduction of each captured tensor before storage
    reduce: Reduce = Reduce.none
    # exceptions to `reduce`, {layer name or glob: reduce}, e.g. {layer4: none}; a layer's own
    # name beats a glob. Typed Any with a null default: Hydra merges a dict from the command line
    # into an existing (typed) one, where struct mode refuses new keys; the runner checks values.
    reduce_by_layer: Any = None
    # forward-only runs stop each forward pass once every hooked module has run (false: run it all)
    stop_early: bool = True
    # auto | cpu | cuda | cuda:N | mps
    device: str = "auto"
    batch_size: int = 16
    num_workers: int = 0
    # take only the first `limit` samples of the dataset; null means all
    limit: int | None = None
    # seeds the random init of models without weights, and the synthetic dataset
    seed: int = 0
    shard: ShardConfig = field(default_factory=ShardConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


def option_name(value) -> str:
    """The name of an enum-typed config value: a composed config holds enum members, while a
    config built by hand may hold plain strings."""
    return value.name if isinstance(value, Enum) else str(value)


def register_configs() -> None:
    """Make the schema available to conf/config.yaml's defaults list as ``probe_schema``."""
    ConfigStore.instance().store(name="probe_schema", node=ProbeConfig)


register_configs()
