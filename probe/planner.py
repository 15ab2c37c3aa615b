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
from contextlib import contextmanager
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
from probe.errors import ConfigError, OutputError, ProbeError
from probe.fingerprint import changes, data_fingerprint, dumps, loads, model_fingerprint
from probe.format import Attr, DatasetSpec, FileState, dataset_key, split_key
from probe.hooks import Capture, parse_hooks
from probe.layers import is_glob, match_layers
from probe.objectives import Objective, make_objective
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
    with WriterLock(path, locking):  # refuse now, not after the set-up, if another run writes
        found = None if cfg.output.overwrite else existing_run(path, config_yaml, locking)

    device = resolve_device(cfg.device)
    model = build_model(cfg) if model is None else model
    dataset = build_dataset(cfg) if dataset is None else dataset
    fingerprints = {Attr.MODEL_FINGERPRINT: model_fingerprint(model),
                    Attr.DATA_FINGERPRINT: data_fingerprint(dataset)}
    if found is not None:
        _require_same_inputs(found, fingerprints)
        if found.complete:
            log.info("%s is already complete for this config; nothing to do", path)
            return Plan(cfg, path, config_yaml, locking, resume_from=None)
        log.info("resuming %s after %d committed rows", found.path, found.num_committed)
    resume_from = 0 if found is None else found.num_committed
    model = model.eval().to(device)
    indices = select_indices(len(dataset), cfg.limit, cfg.shard.index, cfg.shard.count,
                             subset=option_name(cfg.subset), seed=int(cfg.seed))
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
    for pattern in map(str, cfg.layers):
        if is_glob(pattern):
            log.info("layers: %s matches %s", pattern,
                     ", ".join(match_layers(capture.layers, pattern)))
    log.info("model %s on %s; %d layers x %s; %d samples of %s -> %s",
             type(model).__name__, device, len(capture.layers), [h.name for h in hooks],
             len(indices), human_bytes(row_bytes), path)
    if cfg.output.check_free_space:
        check_free_space(path.parent, row_bytes * (len(indices) - resume_from))
    return Plan(cfg, path, config_yaml, locking, resume_from, device=device, model=model,
                dataset=dataset, indices=indices, has_target=with_target, objective=objective,
                capture=capture, datasets=datasets,
                attrs={**_root_attrs(cfg, capture, objective_name),
                       **{key: dumps(value) for key, value in fingerprints.items()}},
                row_bytes=row_bytes,
                dry_run_seconds=dry_run_seconds)


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
    with dry, torch.inference_mode(), _failing_module(capture.model) as running:
        try:
            capture.model(sample.unsqueeze(0).to(device))
        except ProbeError:
            raise
        except Exception as err:  # the model's own error: say where, in one line
            name = running[-1] if running else "the model"
            kind = type(dict(capture.model.named_modules())[name]).__name__ if running else ""
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(
                f"the model fails on one sample of shape {tuple(sample.shape)} in {name}"
                f"{f' ({kind})' if kind else ''}: {reason}; check that the inputs suit the "
                "model (a dataset.image_size too small for it?)"
            ) from None
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


@contextmanager
def _failing_module(model: nn.Module):
    """The names of the modules running right now, innermost last: after an exception in the
    forward pass, the module that raised it is the last one."""
    running: list[str] = []

    def enter(name: str) -> None:
        running.append(name)

    def leave() -> None:  # returns None: a forward hook's result would replace the output
        running.pop()

    handles = []
    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_pre_hook(lambda *_, n=name: enter(n)))
            handles.append(module.register_forward_hook(lambda *_: leave()))
    try:
        yield running
    finally:
        for handle in reversed(handles):
            handle.remove()


def _root_attrs(cfg: DictConfig, capture: Capture, objective_name: str) -> dict:
    attrs = {Attr.LAYERS: list(capture.layers), Attr.HOOKS: [h.name for h in capture.hooks],
             Attr.SHARD_INDEX: int(cfg.shard.index), Attr.SHARD_COUNT: int(cfg.shard.count)}
    if capture.needs_grad:
        attrs[Attr.OBJECTIVE] = objective_name
    return attrs
