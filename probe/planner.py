"""The plan of a run: everything that can fail is decided here, before a file exists.

``plan(cfg)`` reads the config once (probe.settings), finds what the output path already holds,
builds the model and the dataset, looks up the model's family and the data's feed, resolves
the layers and runs one sample through the model (the dry run) to learn how every stored key
is made and how large it is. ``probe.runner.execute`` then carries the plan out. Tests and
benchmarks pass their own model or dataset::

    p = plan(cfg, model=my_model, dataset=my_data)
    execute(p)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import Dataset

from probe.build import build_dataset, build_model
from probe.data import check_selection, select_indices
from probe.dryrun import dry_run
from probe.errors import ConfigError, DataError, OutputError
from probe.families import Family, family_for
from probe.feeds import Batching, Feed, OpenSelection, Selection, feed_for
from probe.fingerprint import (
    changes,
    data_fingerprint,
    dumps,
    library_versions,
    loads,
    model_fingerprint,
)
from probe.format import INDEX, SKIPPED, Attr, DatasetSpec, FileState
from probe.hooks import Capture
from probe.keys import transforms_for
from probe.layers import is_glob, match_layers
from probe.objectives import Objective, make_objective
from probe.output import WriterLock, check_free_space, check_writable, existing_run
from probe.partial import open_for_reading
from probe.settings import Settings, read_settings
from probe.units import human_bytes

__all__ = ["Plan", "plan"]

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """A run, decided: where it writes, from which sample, what it computes and stores.

    ``done`` plans (the finished file is there already) carry no model.
    """

    settings: Settings
    # where the samples resume: the selection's first ``resume_from`` are in the file already,
    # as ``resume_rows`` rows and ``resume_skipped`` samples left out; None: the file is
    # complete already, and there is nothing to do
    resume_from: int | None
    resume_rows: int = 0
    resume_skipped: int = 0
    committed: int = 0  # the rows the partial file held when planned
    # a complete file still under its partial name (its run was killed just before the rename)
    renamed_only: bool = False
    device: torch.device | None = None
    model: nn.Module | None = None
    family: Family | None = None  # what the model needs (probe.families)
    dataset: Dataset | None = None
    feed: Feed | None = None  # how the dataset's items reach the model (probe.feeds)
    batching: Batching | None = None
    selection: Selection = field(default_factory=list)  # the samples this job takes, in order
    has_target: bool = False
    objective: Objective | None = None
    capture: Capture | None = None
    datasets: dict[str, DatasetSpec] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    num_positions: int | None = None  # rows per position in all, where the run stores those
    row_bytes: int = 0  # bytes per sample, of the datasets with one row per sample
    dry_run_seconds: float = 0.0

    @property
    def path(self):
        return self.settings.output.path

    @property
    def done(self) -> bool:
        return self.resume_from is None

    @property
    def num_rows(self) -> int | None:
        """The rows this job stores (None where that is not known before it ends: an open
        selection, or samples that may be left out)."""
        if isinstance(self.selection, OpenSelection) or self.settings.skip_bad:
            return None
        return len(self.selection)

    @property
    def per_position(self) -> bool:
        return any(spec.per_position for spec in self.datasets.values())


def plan(cfg: DictConfig, *, model: nn.Module | None = None,
         dataset: Dataset | None = None) -> Plan:
    """Decide the run that ``cfg`` describes; ``model`` and ``dataset`` replace the ones the
    config names (they are still put in eval mode on the configured device).

    Raises:
        ProbeError: a config value, file, model, dataset or device that cannot work. Nothing
            has been written then.
    """
    # 1. the settings and the output path: the cheap refusals first
    settings = read_settings(cfg)
    out = settings.output
    check_writable(out.path.parent)
    with WriterLock(out.path, out.locking):  # refuse now, not after the set-up, if another writes
        found = existing_run(out.path, settings.config_yaml, out.locking, overwrite=out.overwrite)

    # 2. the model and the data, and whether they are what the file there was made from
    model = build_model(cfg) if model is None else model
    dataset = build_dataset(cfg) if dataset is None else dataset
    fingerprints = {Attr.MODEL_FINGERPRINT: model_fingerprint(model),
                    Attr.DATA_FINGERPRINT: data_fingerprint(dataset)}
    if found is not None:
        _require_same_inputs(found, fingerprints)
        if found.complete:
            renamed = found.path != out.path
            if renamed:
                log.info("%s is complete but was stopped before its rename; renaming it to %s",
                         found.path, out.path.name)
            else:
                log.info("%s is already complete for this config; nothing to do", out.path)
            return Plan(settings, resume_from=None, renamed_only=renamed)

    # 3. what to compute: the family and the feed, the samples, the objective, the hooks, and a
    # dry run that finds how every key is stored
    family, feed = family_for(cfg.model, model), feed_for(dataset)
    family.check_data(model, feed)
    model, device = family.place(model.eval(), settings.device, settings.asked_device)
    batching = _batching(settings, feed, device)
    selection = _selection(settings, dataset)
    resume = (0, 0, 0) if found is None else _resume_point(found, selection, batching)
    if found is not None:
        log.info("resuming %s after %d committed rows", found.path, resume[1])
    batches = _dry_batches(feed, dataset, selection, settings.skip_bad)
    with_target = feed.has_targets(dataset, int(batches[0].index[0]))
    objective, objective_name = (make_objective(settings.objective, family, model)
                                 if settings.needs_grad else (None, None))
    if objective_name == "target" and not with_target:
        raise ConfigError(
            "objective=target but the dataset has no targets; use objective=top1, or a dataset "
            f"with targets ({feed.targets_hint})"
        )
    capture = Capture(model, settings.layers, settings.hooks, reduce=settings.reduce,
                      reduce_by_layer=settings.reduce_by_layer, dtype=settings.output.dtype,
                      stop_early=settings.stop_early)
    family.check_layers(model, feed, capture.reduces)
    started = time.perf_counter()
    shown = dry_run(capture, family, feed, batches, device, objective)
    dry_run_seconds = time.perf_counter() - started
    pool = settings.tokens
    capture.transforms = transforms_for(shown.shapes, shown.layouts, capture.reduces, pool=pool,
                                        dtype=settings.output.dtype, positions=feed.positions,
                                        axis=shown.axis, prefix=shown.prefix, grid=shown.grid)
    capture.arm()  # the dry run counted every hooked module's runs
    if pool.name != "all" and not shown.layouts:
        log.warning("%s=%s has no effect: no stored output of this model has a position axis "
                    "to pool", Attr.TOKENS, pool.name)
    datasets = {**_specs(capture), **feed.bookkeeping(dataset)}
    if settings.skip_bad:
        datasets[SKIPPED] = DatasetSpec((), "int64", {Attr.DIMS: ["skipped"]},
                                        compressible=False)
    positions = (feed.stored_positions(dataset, selection)
                 if any(spec.per_position for spec in datasets.values()) else None)

    # 4. what it takes: said in the log, and checked against the free disk space
    sample_bytes = 16 + sum(s.row_bytes for s in datasets.values() if not s.per_position)
    position_bytes = sum(s.row_bytes for s in datasets.values() if s.per_position)
    _log_plan(settings, capture, device, selection, positions, sample_bytes, position_bytes)
    if isinstance(selection, OpenSelection):
        log.info("the number of samples is not known before they are read: free space is not "
                 "checked")
    elif out.check_free_space:
        left = 0 if positions is None else int(positions[resume[0]:].sum())
        check_free_space(out.path.parent,
                         sample_bytes * (len(selection) - resume[0]) + position_bytes * left)
    attrs = {**_root_attrs(settings, capture, objective_name), **feed.attrs(dataset),
             **library_versions(), **{key: dumps(value) for key, value in fingerprints.items()}}
    return Plan(settings, resume[0], resume_rows=resume[1], resume_skipped=resume[2],
                committed=0 if found is None else found.num_committed, device=device,
                model=model, family=family, dataset=dataset, feed=feed, batching=batching,
                selection=selection, has_target=with_target, objective=objective,
                capture=capture, datasets=datasets, attrs=attrs,
                num_positions=None if positions is None else int(positions.sum()),
                row_bytes=sample_bytes, dry_run_seconds=dry_run_seconds)


def _specs(capture: Capture) -> dict[str, DatasetSpec]:
    """What the store creates for each key: its transform's rows, type and attrs."""
    specs = {}
    for key in capture.keys:
        transform = capture.transforms[key]
        attrs = {**capture.attrs(key), Attr.DIMS: list(transform.dims)}
        specs[key] = DatasetSpec(transform.row_shape, str(capture.dtype).removeprefix("torch."),
                                 attrs, per_position=transform.per_position)
    return specs


def _pools_positions(capture: Capture) -> bool:
    return any(t.pool is not None for t in capture.transforms.values())


def _dry_batches(feed: Feed, dataset: Dataset, selection: Selection, skip_bad: bool) -> list:
    """The dry run's batches, of the first sample of the selection that loads (with
    dataset.on_error=skip, of the first that loads among the first hundred)."""
    if isinstance(selection, OpenSelection):
        return feed.dry_batches(dataset, selection.shard_index)
    candidates = selection[:100 if skip_bad else 1]
    for n, index in enumerate(candidates):
        try:
            return feed.dry_batches(dataset, index)
        except DataError:
            if n == len(candidates) - 1:
                raise
    raise AssertionError("a selection is never empty")


def _selection(settings: Settings, dataset) -> Selection:
    """The samples this job takes: by ``limit``, ``subset`` and ``shard``."""
    try:
        size = len(dataset)
    except TypeError:  # read as it comes: its length is not known before its end
        size = None
    if size is not None:
        return select_indices(size, settings.limit, settings.shard_index, settings.shard_count,
                              subset=settings.subset, seed=settings.seed)
    if settings.subset == "random":
        raise ConfigError("subset=random picks samples from the whole dataset, which one read "
                          "as it comes cannot; use subset=first, or read it whole")
    if settings.skip_bad:
        raise ConfigError("dataset.on_error=skip is not supported for a dataset read as it "
                          "comes; read it whole, or fix the samples")
    check_selection(settings.limit, settings.shard_index, settings.shard_count)
    return OpenSelection(settings.limit, settings.shard_index, settings.shard_count)


def _resume_point(found: FileState, selection: Selection,
                  batching: Batching) -> tuple[int, int, int]:
    """Where a run resumes: (samples of the selection done, rows kept, samples left out kept).
    The committed rows and left-out samples cover the selection's first samples. A group's
    batches are made from its start: a run resumes there, so that they are the same batches."""
    rows, skipped = found.num_committed, int(found.attrs.get(Attr.NUM_SKIPPED, 0))
    done = rows + skipped
    start = done - done % batching.group
    if start == done:
        return done, rows, skipped
    if not skipped:
        return start, start, 0
    # rows and left-out samples interleave: keep those before the group's first sample
    with open_for_reading(found.path) as f:
        index, left_out = f[INDEX][:rows], f[SKIPPED][:skipped]
    boundary = selection[start]
    return (start, int(np.searchsorted(index, boundary)),
            int(np.searchsorted(left_out, boundary)))


def _batching(settings: Settings, feed: Feed, device: torch.device) -> Batching:
    if settings.batch_tokens is not None and not feed.positions:
        raise ConfigError("batch_tokens is a budget of padded positions per batch, for "
                          "batches of sequences; use batch_size for this dataset")
    return Batching(settings.batch_size, settings.batch_tokens,
                    bucket=settings.bucket_by_length and feed.positions,
                    num_workers=settings.num_workers, pin_memory=device.type == "cuda",
                    skip_bad=settings.skip_bad)


def _log_plan(settings: Settings, capture: Capture, device: torch.device, selection: Selection,
              positions, sample_bytes: int, position_bytes: int) -> None:
    for pattern in settings.layers:
        if is_glob(pattern):
            log.info("layers: %s matches %s", pattern,
                     ", ".join(match_layers(capture.layers, pattern)))
    if isinstance(selection, OpenSelection):
        size = f"samples as they come, {human_bytes(position_bytes)} a position"
    elif positions is None:
        size = f"{len(selection)} samples of {human_bytes(sample_bytes)}"
    else:
        size = (f"{len(selection)} samples, {int(positions.sum())} positions of "
                f"{human_bytes(position_bytes)}")
    log.info("model %s on %s; %d layers x %s; %s -> %s", type(capture.model).__name__, device,
             len(capture.layers), [h.name for h in capture.hooks], size, settings.output.path)
    if settings.output.compression == "lzf":
        log.info("output.compression=lzf: only h5py reads lzf; the HDF5 C tools, MATLAB, Julia "
                 "and R show its datasets as empty. Use gzip for files that leave Python")


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


def _root_attrs(settings: Settings, capture: Capture, objective_name: str | None) -> dict:
    attrs = {Attr.LAYERS: list(capture.layers), Attr.HOOKS: [h.name for h in capture.hooks],
             Attr.SHARD_INDEX: settings.shard_index, Attr.SHARD_COUNT: settings.shard_count}
    if objective_name is not None:
        attrs[Attr.OBJECTIVE] = objective_name
    if _pools_positions(capture):
        attrs[Attr.TOKENS] = settings.tokens.name
    return attrs
