"""The config, read once: ``read_settings(cfg)`` checks every value that needs no model or
data and turns the composed config into typed settings, which the rest of the pipeline takes.
Nothing after the planner's first phase reads the raw config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from probe.config import Compression, Dtype, Subset, check_known_keys, option_name
from probe.device import resolve_device
from probe.errors import ConfigError
from probe.format import Hook, Reduce, Tokens, member
from probe.hooks import parse_hooks
from probe.output import file_locking, output_path
from probe.store import filter_options

__all__ = ["Settings", "OutputSettings", "read_settings", "TORCH_DTYPES"]

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_ON_ERROR = ("raise", "skip")


@dataclass(frozen=True)
class OutputSettings:
    """Where and how the file is written."""

    path: Path
    overwrite: bool
    dtype: torch.dtype
    filters: Mapping  # HDF5 filter options of create_dataset (probe.store.filter_options)
    compression: str
    commit_every: int
    commit_seconds: float
    check_free_space: bool
    locking: bool | str | None


@dataclass(frozen=True)
class Settings:
    """Every setting of a run, typed and checked."""

    config_yaml: str  # the resolved config, as the file records it
    layers: tuple[str, ...]
    hooks: tuple[Hook, ...]
    objective: object  # a name, or a {_target_: ...} node (probe.objectives)
    reduce: Reduce
    reduce_by_layer: Mapping | None
    tokens: Tokens
    stop_early: bool
    device: torch.device
    asked_device: str
    batch_size: int
    batch_tokens: int | None
    bucket_by_length: bool
    num_workers: int
    limit: int | None
    subset: str
    seed: int
    shard_index: int
    shard_count: int
    skip_bad: bool  # dataset.on_error=skip
    output: OutputSettings

    @property
    def needs_grad(self) -> bool:
        return any(hook.needs_grad for hook in self.hooks)


def read_settings(cfg: DictConfig) -> Settings:
    """The settings of a composed config.

    Raises:
        ConfigError: a key that is not probe's, or a value that cannot work.
        OutputError: no output path outside a Hydra run.
        DeviceError: the device is not on this machine.
    """
    check_known_keys(cfg)
    for key, value, least in (("batch_size", cfg.batch_size, 1), ("num_workers",
                                                                  cfg.num_workers, 0),
                              ("output.commit_every", cfg.output.commit_every, 1)):
        if int(value) < least:
            what = {"output.commit_every": " (batches between commits)"}.get(key, "")
            raise ConfigError(f"{key}={value} must be {'at least 1' if least else '0 or more'}"
                              f"{what}")
    if not float(cfg.output.commit_seconds) > 0:
        raise ConfigError(f"output.commit_seconds={cfg.output.commit_seconds} must be more "
                          "than 0 (seconds between commits)")
    if cfg.batch_tokens is not None and int(cfg.batch_tokens) < 1:
        raise ConfigError(f"batch_tokens={cfg.batch_tokens} must be at least 1, or null")
    on_error = str(cfg.dataset.get("on_error", "raise"))
    if on_error not in _ON_ERROR:
        raise ConfigError(f"dataset.on_error={on_error!r}: use raise (stop at a sample that "
                          "cannot be loaded) or skip (leave it out, and record it in /skipped)")
    compression = option_name(member(Compression, option_name(cfg.output.compression),
                                     f"output.compression={cfg.output.compression!r}"))
    level = cfg.output.compression_level
    dtype = option_name(member(Dtype, option_name(cfg.output.dtype),
                               f"output.dtype={cfg.output.dtype!r}"))
    output = OutputSettings(
        path=output_path(cfg), overwrite=bool(cfg.output.overwrite), dtype=TORCH_DTYPES[dtype],
        filters=filter_options(compression, None if level is None else int(level)),
        compression=compression, commit_every=int(cfg.output.commit_every),
        commit_seconds=float(cfg.output.commit_seconds),
        check_free_space=bool(cfg.output.check_free_space),
        locking=file_locking(cfg.output.file_locking))
    return Settings(
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
        layers=tuple(str(layer) for layer in cfg.layers),
        hooks=tuple(parse_hooks(cfg.hooks)),
        objective=cfg.objective,
        reduce=member(Reduce, option_name(cfg.reduce), f"reduce={cfg.reduce!r}"),
        reduce_by_layer=cfg.reduce_by_layer,
        tokens=member(Tokens, option_name(cfg.tokens), f"tokens={cfg.tokens!r}"),
        stop_early=bool(cfg.stop_early),
        device=resolve_device(cfg.device), asked_device=str(cfg.device),
        batch_size=int(cfg.batch_size),
        batch_tokens=None if cfg.batch_tokens is None else int(cfg.batch_tokens),
        bucket_by_length=bool(cfg.bucket_by_length), num_workers=int(cfg.num_workers),
        limit=None if cfg.limit is None else int(cfg.limit),
        subset=option_name(member(Subset, option_name(cfg.subset), f"subset={cfg.subset!r}")),
        seed=int(cfg.seed), shard_index=int(cfg.shard.index), shard_count=int(cfg.shard.count),
        skip_bad=on_error == "skip", output=output)
