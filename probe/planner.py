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

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from probe.build import build_dataset, build_model
from probe.config import check_known_keys, option_name
from probe.data import has_targets, select_indices, split_item
from probe.device import resolve_device
from probe.errors import ConfigError
from probe.format import Attr, DatasetSpec, dataset_key, split_key
from probe.hooks import Capture, parse_hooks
from probe.objectives import Objective, make_objective
from probe.output import check_free_space, check_writable, existing_run, file_locking, output_path
from probe.store import filter_options

__all__ = ["Plan", "plan", "TORCH_DTYPES"]

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


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
    device: torch.device | None = None
    model: nn.Module | None = None
    dataset: Dataset | None = None
    indices: list[int] = field(default_factory=list)
    has_target: bool = False
    objective: Objective | None = None
    capture: Capture | None = None
    datasets: dict[str, DatasetSpec] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    row_bytes: int = 0
    dry_run_seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.resume_from is None

    @property
    def num_rows(self) -> int:
        return len(self.indices)


def plan(cfg: DictConfig, *, model: nn.Module | None = None,
         dataset: Dataset | None = None) -> Plan:
    """Decide the run that ``cfg`` describes; ``model`` and ``dataset`` replace the ones the
    config names (they are still put in eval mode on the configured device).

    Raises:
        ProbeError: a config value, file, model, dataset or device that cannot work. Nothing
            has been written then.
    """
    _check_config(cfg)
    hooks = parse_hooks(cfg.hooks)
    path = output_path(cfg)
    locking = file_locking(cfg.output.file_locking)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    check_writable(path.parent)
    found = None if cfg.output.overwrite else existing_run(path, config_yaml, locking)
    if found is not None and found.complete:
        log.info("%s is already complete for this config; nothing to do", path)
        return Plan(cfg, path, config_yaml, locking, resume_from=None)
    resume_from = 0 if found is None else found.num_committed
    if resume_from:
        log.info("resuming %s after %d committed rows", found.path, resume_from)

    device = resolve_device(cfg.device)
    model = (build_model(cfg) if model is None else model).eval().to(device)
    dataset = build_dataset(cfg) if dataset is None else dataset
    indices = select_indices(len(dataset), cfg.limit, cfg.shard.index, cfg.shard.count)
    with_target = has_targets(dataset)
    objective, objective_name = make_objective(cfg.objective)
    if any(h.needs_grad for h in hooks) and objective_name == "target" and not with_target:
        raise ConfigError(
            "objective=target but the dataset has no targets; use objective=top1 or a dataset "
            "whose items are (input, target)"
        )
    capture = Capture(model, cfg.layers, hooks, reduce=cfg.reduce,
                      reduce_by_layer=cfg.reduce_by_layer,
                      dtype=TORCH_DTYPES[option_name(cfg.output.dtype)],
                      stop_early=bool(cfg.stop_early))
    started = time.perf_counter()
    datasets = _dry_run(capture, dataset[indices[0]], device)
    dry_run_seconds = time.perf_counter() - started
    capture.arm()  # the dry run was a complete pass: every hooked module ran, once
    row_bytes = 16 + sum(spec.row_bytes for spec in datasets.values())  # + index and target
    log.info("model %s on %s; %d layers x %s; %d samples of %.2f MiB -> %s",
             type(model).__name__, device, len(capture.layers), [h.name for h in hooks],
             len(indices), row_bytes / 2**20, path)
    if cfg.output.check_free_space:
        check_free_space(path.parent, row_bytes * (len(indices) - resume_from))
    return Plan(cfg, path, config_yaml, locking, resume_from, device=device, model=model,
                dataset=dataset, indices=indices, has_target=with_target, objective=objective,
                capture=capture, datasets=datasets,
                attrs=_root_attrs(cfg, capture, objective_name), row_bytes=row_bytes,
                dry_run_seconds=dry_run_seconds)


def _check_config(cfg: DictConfig) -> None:
    check_known_keys(cfg)
    if int(cfg.batch_size) < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be at least 1")
    if int(cfg.num_workers) < 0:
        raise ConfigError(f"num_workers={cfg.num_workers} must be 0 or more")
    filter_options(option_name(cfg.output.compression), cfg.output.compression_level)


# the forward hook whose value has the shape of each kind (gradients have their tensor's shape)
_SHAPE_SOURCE = {"output": "forward", "grad_output": "forward", "input": "forward_pre",
                 "grad_input": "forward_pre"}


def _dry_run(capture: Capture, item, device: torch.device) -> dict[str, DatasetSpec]:
    """One sample through the model, forward only, with hooks of its own: the spec of every
    dataset the run stores. It also finds layers that do not run, or run more than once,
    before any file is made."""
    sample, _ = split_item(item)
    kinds = sorted({_SHAPE_SOURCE[hook.kind] for hook in capture.hooks})
    dry = Capture(capture.model, capture.layers, kinds, reduce_by_layer=capture.reduces,
                  dtype=capture.dtype)
    with dry, torch.inference_mode():
        capture.model(sample.unsqueeze(0).to(device))
        seen = dry.take()
    dtype = str(capture.dtype).removeprefix("torch.")
    specs: dict[str, DatasetSpec] = {}
    for key in capture.keys:
        layer, kind = split_key(key)
        source = dataset_key(layer, kind.removeprefix("grad_"))
        attrs = capture.attrs(key)
        if source in dry.tuple_positions:
            attrs[Attr.TUPLE_POSITION] = dry.tuple_positions[source]
        specs[key] = DatasetSpec(tuple(seen[source].shape[1:]), dtype, attrs)
    return specs


def _root_attrs(cfg: DictConfig, capture: Capture, objective_name: str) -> dict:
    attrs = {Attr.LAYERS: list(capture.layers), Attr.HOOKS: [h.name for h in capture.hooks],
             Attr.SHARD_INDEX: int(cfg.shard.index), Attr.SHARD_COUNT: int(cfg.shard.count)}
    if capture.needs_grad:
        attrs[Attr.OBJECTIVE] = objective_name
    return attrs
