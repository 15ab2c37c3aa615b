"""The plan of a run: everything that can fail is decided here, before a file exists.

``plan(cfg)`` checks the config, finds what the output path already holds, builds the model and
the dataset, resolves the layers and runs one sample through the model (the dry run) to learn
the shape of every dataset and the bytes each row adds. ``probe.runner.execute`` then carries
the plan out. Tests and benchmarks pass their own model or dataset::

    p = plan(cfg, model=my_model, dataset=my_data)
    execute(p)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from probe.build import build_dataset, build_model
from probe.config import check_known_keys, option_name
from probe.data import check_selection, select_indices
from probe.device import resolve_device
from probe.dryrun import dry_run
from probe.errors import ConfigError, OutputError
from probe.feed import Batching, Objective, StreamSlice, feed_for
from probe.fingerprint import changes, data_fingerprint, dumps, loads, model_fingerprint
from probe.format import Attr, DatasetSpec, FileState
from probe.hooks import Capture, parse_hooks
from probe.layers import is_glob, match_layers
from probe.output import (
    WriterLock,
    check_free_space,
    check_writable,
    existing_run,
    file_locking,
    output_path,
)
from probe.store import filter_options
from probe.units import human_bytes

__all__ = ["Plan", "plan", "TORCH_DTYPES"]

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Plan:
    """A run, decided: where it writes, from which row, what it computes and stores.

    ``done`` plans (the finished file is there already) carry no model.
    """

    cfg: DictConfig
    path: Path
    config_yaml: str
    locking: bool | str | None
    resume_from: int | None  # None: the file is complete already, there is nothing to do
    # a complete file still under its partial name (its run was killed just before the rename)
    renamed_only: bool = False
    committed: int = 0  # the rows the partial file held when planned (resume_from <= it)
    device: torch.device | None = None
    model: nn.Module | None = None
    dataset: Dataset | None = None
    feed: Any = None  # how the dataset's items reach the model (probe.feed)
    batching: Batching | None = None  # how the samples are cut into batches
    # the samples this job takes, in order: dataset indices, or the part of a stream
    indices: list[int] | StreamSlice = field(default_factory=list)
    has_target: bool = False
    objective: Objective | None = None
    capture: Capture | None = None
    datasets: dict[str, DatasetSpec] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    num_tokens: int | None = None  # token rows in all, for a run with rows per token
    row_bytes: int = 0  # bytes per sample, of the datasets with one row per sample
    dry_run_seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.resume_from is None

    @property
    def num_rows(self) -> int | None:
        """The samples this job stores (None for a stream, unknown before it ends)."""
        return None if isinstance(self.indices, StreamSlice) else len(self.indices)


def plan(cfg: DictConfig, *, model: nn.Module | None = None,
         dataset: Dataset | None = None) -> Plan:
    """Decide the run that ``cfg`` describes; ``model`` and ``dataset`` replace the ones the
    config names (they are still put in eval mode on the configured device).

    Raises:
        ProbeError: a config value, file, model, dataset or device that cannot work. Nothing
            has been written then.
    """
    # 1. the config and the output path: the cheap refusals first
    _check_config(cfg)
    hooks = parse_hooks(cfg.hooks)
    path = output_path(cfg)
    locking = file_locking(cfg.output.file_locking)
    device = resolve_device(cfg.device)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    check_writable(path.parent)
    with WriterLock(path, locking):  # refuse now, not after the set-up, if another run writes
        found = existing_run(path, config_yaml, locking, overwrite=bool(cfg.output.overwrite))

    # 2. the model and the data, and whether they are what the file there was made from
    model = build_model(cfg) if model is None else model
    dataset = build_dataset(cfg) if dataset is None else dataset
    fingerprints = {Attr.MODEL_FINGERPRINT: model_fingerprint(model),
                    Attr.DATA_FINGERPRINT: data_fingerprint(dataset)}
    if found is not None:
        _require_same_inputs(found, fingerprints)
        if found.complete:
            if found.path != path:
                log.info("%s is complete but was stopped before its rename; renaming it to %s",
                         found.path, path.name)
            else:
                log.info("%s is already complete for this config; nothing to do", path)
            return Plan(cfg, path, config_yaml, locking, resume_from=None,
                        renamed_only=found.path != path)
    resume_from = 0 if found is None else found.num_committed

    # 3. what to compute: the samples, the objective, the hooks, and a dry run that finds the
    # shape of every dataset
    model, device = _placed(model.eval(), device, cfg.device)
    feed = feed_for(dataset)
    batching = _batching(cfg, feed, device)
    # a window's batches are made from its start: resume there, and they are the same batches
    resume_from -= resume_from % batching.window
    if found is not None:
        log.info("resuming %s after %d committed rows", found.path, resume_from)
    indices = _selection(cfg, dataset)
    with_target = feed.has_targets(dataset)
    objective, objective_name = feed.objective(cfg.objective, model)
    needs_grad = any(h.needs_grad for h in hooks)
    if needs_grad and objective_name == "target" and not with_target:
        raise ConfigError(
            "objective=target but the dataset has no targets; use objective=top1, or a dataset "
            "with targets (items (input, target); for text, dataset.label_column)"
        )
    capture = Capture(model, cfg.layers, hooks, reduce=cfg.reduce,
                      reduce_by_layer=cfg.reduce_by_layer,
                      dtype=TORCH_DTYPES[option_name(cfg.output.dtype)],
                      stop_early=bool(cfg.stop_early), tokens=option_name(cfg.tokens))
    started = time.perf_counter()
    first = indices.shard_index if isinstance(indices, StreamSlice) else indices[0]
    datasets = dry_run(capture, feed, feed.dry_batches(dataset, first), device,
                       objective if needs_grad else None)
    dry_run_seconds = time.perf_counter() - started
    capture.arm()  # the dry run counted every hooked module's runs
    tokens = feed.stored_tokens(dataset, indices) if feed.token_rows else None
    if feed.token_rows:
        datasets.update(feed.token_datasets(dataset))

    # 4. what it takes: said in the log, and checked against the free disk space
    sample_bytes = 16 + sum(s.row_bytes for s in datasets.values() if not s.per_token)
    token_bytes = sum(s.row_bytes for s in datasets.values() if s.per_token)
    _log_plan(cfg, capture, device, indices, tokens, sample_bytes, token_bytes, path)
    if isinstance(indices, StreamSlice):
        log.info("a stream's size is not known before it is read: free space is not checked")
    elif cfg.output.check_free_space:
        left = 0 if tokens is None else int(tokens[resume_from:].sum())
        check_free_space(path.parent,
                         sample_bytes * (len(indices) - resume_from) + token_bytes * left)
    attrs = {**_root_attrs(cfg, capture, objective_name), **feed.attrs(dataset),
             **{key: dumps(value) for key, value in fingerprints.items()}}
    return Plan(cfg, path, config_yaml, locking, resume_from, device=device, model=model,
                committed=0 if found is None else found.num_committed, dataset=dataset,
                feed=feed, batching=batching, indices=indices,
                has_target=with_target,
                objective=objective, capture=capture, datasets=datasets, attrs=attrs,
                num_tokens=None if tokens is None else int(tokens.sum()),
                row_bytes=sample_bytes, dry_run_seconds=dry_run_seconds)


def _selection(cfg: DictConfig, dataset) -> list[int] | StreamSlice:
    """The samples this job takes: by ``limit``, ``subset`` and ``shard``."""
    if not getattr(dataset, "streaming", False):
        return select_indices(len(dataset), cfg.limit, cfg.shard.index, cfg.shard.count,
                              subset=option_name(cfg.subset), seed=int(cfg.seed))
    if option_name(cfg.subset) == "random":
        raise ConfigError("subset=random picks samples from the whole dataset, which a stream "
                          "cannot; use subset=first, or dataset.streaming=false")
    check_selection(cfg.limit, int(cfg.shard.index), int(cfg.shard.count))
    return StreamSlice(None if cfg.limit is None else int(cfg.limit), int(cfg.shard.index),
                       int(cfg.shard.count))


def _placed(model: nn.Module, device: torch.device, asked: str) -> tuple[nn.Module, torch.device]:
    """The model on ``device``; or, spread over devices by a device map (transformers'
    device_map=auto), as it is, with the inputs going where its input embeddings live."""
    if not getattr(model, "hf_device_map", None):
        return model.to(device), device
    if str(asked) != "auto":
        raise ConfigError(f"device={asked} but model.device_map already places the model; "
                          "leave device=auto")
    return model, model.get_input_embeddings().weight.device


def _batching(cfg: DictConfig, feed, device: torch.device) -> Batching:
    if cfg.batch_tokens is not None and int(cfg.batch_tokens) < 1:
        raise ConfigError(f"batch_tokens={cfg.batch_tokens} must be at least 1, or null")
    if cfg.batch_tokens is not None and not feed.token_rows:
        raise ConfigError("batch_tokens is a budget of tokens per batch, for language models "
                          "(dataset=text); use batch_size for this dataset")
    return Batching(int(cfg.batch_size),
                    None if cfg.batch_tokens is None else int(cfg.batch_tokens),
                    bucket=bool(cfg.bucket_by_length) and feed.token_rows,
                    num_workers=int(cfg.num_workers), pin_memory=device.type == "cuda")


def _log_plan(cfg: DictConfig, capture: Capture, device: torch.device, indices: list[int],
              tokens, sample_bytes: int, token_bytes: int, path: Path) -> None:
    for pattern in map(str, cfg.layers):
        if is_glob(pattern):
            log.info("layers: %s matches %s", pattern,
                     ", ".join(match_layers(capture.layers, pattern)))
    if isinstance(indices, StreamSlice):
        size = f"a stream of samples, {human_bytes(token_bytes)} a token"
    elif tokens is None:
        size = f"{len(indices)} samples of {human_bytes(sample_bytes)}"
    else:
        size = f"{len(indices)} samples, {int(tokens.sum())} tokens of {human_bytes(token_bytes)}"
    log.info("model %s on %s; %d layers x %s; %s -> %s", type(capture.model).__name__, device,
             len(capture.layers), [h.name for h in capture.hooks], size, path)


def _require_same_inputs(found: FileState, fingerprints: dict) -> None:
    # the same config made from another model or other data would give other values
    for key, what in ((Attr.DATA_FINGERPRINT, "dataset"), (Attr.MODEL_FINGERPRINT, "model")):
        stored = loads(found.attrs.get(key))
        if stored is None:  # written before fingerprints were kept
            log.warning("%s records no %s fingerprint; assuming the %s is the same", found.path,
                        what, what)
            continue
        said = changes(stored, fingerprints[key])
        if said:
            started = "written" if found.complete else "started"
            raise OutputError(
                f"the {what} changed since {str(found.path)!r} was {started} ({'; '.join(said)}) "
                "although the config is the same; set output.overwrite=true to start again, or "
                "choose another output.path"
            )


def _check_config(cfg: DictConfig) -> None:
    check_known_keys(cfg)
    if int(cfg.batch_size) < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be at least 1")
    if int(cfg.num_workers) < 0:
        raise ConfigError(f"num_workers={cfg.num_workers} must be 0 or more")
    if int(cfg.output.commit_every) < 1:
        raise ConfigError(f"output.commit_every={cfg.output.commit_every} must be at least 1 "
                          "(batches between commits)")
    if not float(cfg.output.commit_seconds) > 0:
        raise ConfigError(f"output.commit_seconds={cfg.output.commit_seconds} must be more "
                          "than 0 (seconds between commits)")
    filter_options(option_name(cfg.output.compression), cfg.output.compression_level)


def _root_attrs(cfg: DictConfig, capture: Capture, objective_name: str) -> dict:
    attrs = {Attr.LAYERS: list(capture.layers), Attr.HOOKS: [h.name for h in capture.hooks],
             Attr.SHARD_INDEX: int(cfg.shard.index), Attr.SHARD_COUNT: int(cfg.shard.count)}
    if capture.needs_grad:
        attrs[Attr.OBJECTIVE] = objective_name
    if capture.token_keys:
        attrs[Attr.TOKENS] = capture.tokens.name
    return attrs
