"""The config schema, checked by Hydra when a config is composed, and the one home of every
default: ``conf/config.yaml`` picks the groups and sets Hydra's options, the values are here.

A mistyped key or a value of the wrong type fails at composition with Hydra's own message; a key
added with ``+`` is refused by ``check_known_keys``. ``register_configs()`` puts the schema in
Hydra's ConfigStore as ``probe_schema``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from probe.errors import ConfigError
from probe.format import Hook, Reduce, Tokens, member

__all__ = [
    "CONFIG_DIR",
    "Hook",
    "Reduce",
    "Dtype",
    "Tokens",
    "Compression",
    "Subset",
    "ProbeConfig",
    "NEUTRAL_KEYS",
    "differing_keys",
    "check_known_keys",
    "member",
    "option_name",
    "register_configs",
]


def _config_dir() -> Path:
    # A wheel ships the configs as probe/conf; a source checkout keeps them at the top level.
    packaged = Path(__file__).resolve().parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "conf"


CONFIG_DIR = _config_dir()


class Dtype(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Subset(str, Enum):
    """Which samples ``limit`` takes."""

    first = "first"
    random = "random"


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
    # stored element type; bfloat16 is kept as its raw 16-bit pattern (HDF5 has no bfloat16),
    # with the dataset's dtype attr saying so; probe.open reads it back as float32, exactly
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
    # outputs with (batch, sequence) leading axes (language models, vision transformers): all
    # (one row per real token; padding is never stored), first, last (the last real token),
    # or mean (over the real tokens): one row per sample; patches: a vision transformer's
    # patch tokens alone (no class or register tokens) as (N, features, rows, columns)
    tokens: Tokens = Tokens.all
    # exceptions to `reduce`, {layer name or glob: reduce}, e.g. {layer4: none}; a layer's own
    # name beats a glob. Typed Any with a null default: Hydra merges a dict from the command line
    # into an existing (typed) one, where struct mode refuses new keys; the runner checks values.
    reduce_by_layer: Any = None
    # forward-only runs stop each forward pass once every hooked module has run (false: run it all)
    stop_early: bool = True
    # auto | cpu | cuda | cuda:N | mps
    device: str = "auto"
    batch_size: int = 16
    # language models: a budget of padded token positions per batch, instead of batch_size
    # documents (batch_size still sizes the windows that bucket_by_length sorts)
    batch_tokens: int | None = None
    # language models: batch documents of similar length together (far less padding); the
    # rows are still stored in dataset order
    bucket_by_length: bool = True
    num_workers: int = 0
    # take only `limit` samples of the dataset; null means all
    limit: int | None = None
    # which `limit` samples: the first ones, or a random choice (seeded by `seed`; rows stay in
    # dataset order). `random` suits a folder sorted by class, whose first samples are one class
    subset: Subset = Subset.first
    # seeds the random init of models without weights, the synthetic dataset and subset=random
    seed: int = 0
    shard: ShardConfig = field(default_factory=ShardConfig)
    output: OutputConfig = field(default_factory=OutputConfig)


# Keys that do not change what is stored: a run may resume, or find its finished file, with other
# values of these. conf/config.yaml leaves the same keys out of the run folder's name (a test
# holds the two lists equal).
NEUTRAL_KEYS = ("batch_size", "batch_tokens", "bucket_by_length", "num_workers", "device",
                "stop_early", "output.path",
                "output.overwrite", "output.commit_every", "output.commit_seconds",
                "output.check_free_space", "output.file_locking")


def differing_keys(a: Mapping, b: Mapping, ignore: tuple[str, ...] = NEUTRAL_KEYS) -> list[str]:
    """Dotted keys whose values differ between two configs, leaving out ``ignore``."""
    flat_a, flat_b = _flatten(a), _flatten(b)
    keys = sorted(set(flat_a) | set(flat_b))
    return [k for k in keys if k not in ignore and flat_a.get(k) != flat_b.get(k)]


def _flatten(node: Mapping, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def check_known_keys(cfg: DictConfig, schema: type = ProbeConfig, prefix: str = "") -> None:
    """Refuse keys the schema does not have. Hydra refuses them too, except when added with
    ``+``, which its own hint for a misspelled key suggests (``+batchsize=8``).

    Raises:
        ConfigError: naming the unknown key and the closest real one.
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in cfg:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise ConfigError(f"{prefix}{key} is not a probe config key{hint} (python -m probe "
                              "--help lists them all)")
        kind = fields[str(key)].type
        nested = next((c for c in (ShardConfig, OutputConfig) if kind in (c, c.__name__)), None)
        if nested is not None and isinstance(cfg[key], DictConfig):
            check_known_keys(cfg[key], nested, f"{prefix}{key}.")


def option_name(value) -> str:
    """The name of an enum-typed config value: a composed config holds enum members, while a
    config built by hand may hold plain strings."""
    return value.name if isinstance(value, Enum) else str(value)


def register_configs() -> None:
    """Make the schema available to conf/config.yaml's defaults list as ``probe_schema``, and
    the arguments of the groups' factories to the group files (probe.arguments)."""
    from probe import arguments

    ConfigStore.instance().store(name="probe_schema", node=ProbeConfig)
    arguments.register(CONFIG_DIR)


register_configs()
