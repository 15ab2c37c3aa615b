"""The plan of a run: everything that can fail is decided here, before a file exists.

``plan(cfg)`` reads the config once (probe.config.checks), finds what the output path already
holds, builds the model and the dataset, looks up the model's family and the data's feed,
resolves the layers and runs one sample through the model (the dry run) to learn how every
stored key is made and how large it is. ``probe.pipeline.execute`` then carries the plan out.
Tests and benchmarks pass their own model or dataset::

    p = plan(cfg, model=my_model, dataset=my_data)
    execute(p)
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from probe.config.checks import read_config
from probe.config.device import resolve_device
from probe.config.schema import ProbeConfig, ShardConfig, Subset
from probe.data.feed import Batching, Feed
from probe.data.selection import OpenSelection, Selection, check_selection, select_indices
from probe.data.tensors import feed_for
from probe.errors import ConfigError, DataError, OutputError
from probe.families.base import Family
from probe.families.build import build_dataset, build_model
from probe.families.registry import family_for
from probe.file.format import SKIPPED, Attr, DatasetSpec, FileState, bounds_of, transform_path
from probe.file.output import Output
from probe.file.partial import open_for_reading
from probe.file.recorded import changes, dumps, loads, recorded_config
from probe.file.sizes import human_bytes
from probe.file.store import filter_options
from probe.file.transforms import read_transforms
from probe.pipeline.compact.planned import check_compact, compact_for
from probe.pipeline.dryrun import DryRun, dry_run
from probe.pipeline.fingerprint import data_fingerprint, library_versions, model_fingerprint
from probe.pipeline.fitpass import fit_rows
from probe.pipeline.hooks import Capture
from probe.pipeline.interventions import Intervened, interventions_for
from probe.pipeline.keys import KeyTransform, transforms_for
from probe.pipeline.kinds import capture_kinds
from probe.pipeline.modules import is_glob, lays_channels_first, match_layers
from probe.pipeline.objectives import Objective, make_objective
from probe.pipeline.passes import Pass, pass_for

__all__ = ["Plan", "plan"]

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """A run, decided: where it writes, from which sample, what it computes and stores.

    ``done`` plans (the finished file is there already) carry no model.
    """

    config: ProbeConfig  # typed, as read once (probe.config.checks)
    config_yaml: str  # the resolved config, as the file records it
    output: Output  # where the file goes, and what a run there left (probe.file.output)
    # where the samples resume: the selection's first ``resume_from`` are in the file already,
    # as ``resume_rows`` rows and ``resume_skipped`` samples left out; None: the file is
    # complete already, and there is nothing to do
    resume_from: int | None
    resume_rows: int = 0
    resume_skipped: int = 0
    filters: dict = field(default_factory=dict)  # HDF5 filter options (probe.file.store)
    device: torch.device | None = None
    model: nn.Module | None = None
    family: Family | None = None  # what the model needs (probe.families)
    dataset: Dataset | None = None
    feed: Feed | None = None  # how the dataset's items reach the model (probe.data.feed)
    batching: Batching | None = None
    selection: Selection = field(default_factory=list)  # the samples this job takes, in order
    has_target: bool = False
    objective: Objective | None = None
    capture: Capture | None = None
    compute: Pass | None = None  # how each batch is computed (probe.pipeline.passes)
    datasets: dict[str, DatasetSpec] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    # reduce=pca|srp: each projected key's transform, as the file keeps it (probe.file.transforms)
    transforms: dict[str, dict] = field(default_factory=dict)
    num_positions: int | None = None  # rows per position in all, where the run stores those
    # the same where only a bound or an estimate is known (what chunks are sized by)
    most_positions: int | None = None
    estimated_bytes: int | None = None  # what the rows still to write take on disk, about
    dry_run_seconds: float = 0.0

    @property
    def path(self) -> Path:
        return self.output.path

    @property
    def done(self) -> bool:
        return self.resume_from is None

    @property
    def num_rows(self) -> int | None:
        """The rows this job stores (None where that is not known before it ends: an open
        selection, or samples that may be left out)."""
        if isinstance(self.selection, OpenSelection) or self.config.skip_bad:
            return None
        return len(self.selection)

    @property
    def most_rows(self) -> int | None:
        """The rows this job stores at most (None: not known before it ends)."""
        return None if isinstance(self.selection, OpenSelection) else len(self.selection)

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
    # 1. the config and the output path: the cheap refusals first
    config = read_config(cfg)
    check_compact(config)
    out = config.output
    filters = filter_options(out.compression.name, out.compression_level)
    device = resolve_device(config.device)
    config_yaml = OmegaConf.to_yaml(recorded_config(OmegaConf.to_container(cfg, resolve=True)))
    output = Output(out.path, config_yaml, locking=out.file_locking, overwrite=out.overwrite)
    found = output.found
    decided = {"config": config, "config_yaml": config_yaml, "output": output,
               "filters": filters}

    # 2. the model and the data, and whether they are what the file there was made from
    model = build_model(cfg) if model is None else model
    dataset = build_dataset(cfg) if dataset is None else dataset
    fingerprints = {Attr.MODEL_FINGERPRINT: model_fingerprint(model),
                    Attr.DATA_FINGERPRINT: data_fingerprint(dataset)}
    # what the model runs under (+intervene=): their vectors and sources are part of the inputs
    family = family_for(cfg.model, model)
    interventions = interventions_for(cfg, model, family,
                                      generating=bool(config.generate.max_new_tokens),
                                      model_fingerprint=fingerprints[Attr.MODEL_FINGERPRINT])
    if interventions:
        fingerprints[Attr.INTERVENTION_FINGERPRINT] = interventions.fingerprint()
    if found is not None:
        _require_same_inputs(found, fingerprints)
        if found.complete:
            if found.path != output.path:
                log.info("%s is complete but was stopped before its rename; renaming it to %s",
                         found.path, output.path.name)
            else:
                log.info("%s is already complete for this config; nothing to do", output.path)
            interventions.close()
            return Plan(**decided, resume_from=None)

    # 3. what to compute: the family and the feed, the hooks, the samples, the objective, and
    # a dry run that finds how every key is stored
    feed = feed_for(dataset)
    model, device = family.place(model.eval(), device, config.device)
    kinds = capture_kinds(config.hooks)
    objective, objective_name = (make_objective(config.objective, family, model)
                                 if any(kind.needs_grad for kind in kinds) else (None, None))
    capture = Capture(model, config.layers, kinds, reduce=config.reduce,
                      reduce_by_layer=config.reduce_by_layer, dtype=out.dtype.torch,
                      stop_early=config.stop_early, family=family)
    family.check(model, feed, {capture.paths[layer]: reduce  # by the modules' own paths
                               for layer, reduce in capture.reduces.items()})
    compute = pass_for(config, cfg.model, family, model, capture, objective)
    if interventions:
        compute = Intervened(compute, interventions)
    feed = feed.for_model(family.output_lengths(model))
    batching = _batching(config, feed, device)
    selection = _selection(config, dataset)
    feed.check_fits(dataset, selection, compute.limits(family.input_limits(model)))
    feed.check_loads(dataset, selection, config.skip_bad)
    resume = (0, 0, 0) if found is None else _resume_point(output, selection, batching)
    if found is not None:
        log.info("resuming %s after %d committed rows", found.path, resume[1])
    batches = _dry_batches(feed, dataset, selection, config.skip_bad)
    with_target = feed.has_targets(dataset, int(batches[0].index[0]))
    if objective_name == "target" and not with_target:
        raise ConfigError(
            "objective=target but the dataset has no targets; use objective=top1, or a dataset "
            f"with targets ({feed.targets_hint})"
        )
    started = time.perf_counter()
    shown = dry_run(capture, family, feed, batches, device, objective,
                    around=interventions.rehearsing)
    dry_run_seconds = time.perf_counter() - started
    # the standard names hooked are the modules they name (before the first write)
    verified = _verified(config, family, model, capture, batches[0].to(device))
    layout = compute.rows(shown.layout)  # the layout of the rows stored
    layout.check(shown.plain, capture.needs_grad)
    modules = dict(model.named_modules())
    transforms = transforms_for(
        shown.shapes, shown.axes, shown.follows, capture.reduces, layout=layout,
        pool=config.tokens, dtype=out.dtype.torch,
        channels_first={layer for layer, path in capture.paths.items()
                        if lays_channels_first(modules[path])},
        longest=feed.longest(dataset), components=config.reduce_components)
    capture.arm(shown.calls, shown.where, transforms)
    compute.rehearse(batches[0].to(device))
    # what each key's datasets store: projected (pca fits here, on the pass as rehearsed; a
    # resumed run reads its own file's projections back), encoded
    compact = compact_for(config, transforms, stored=_stored_transforms(found),
                          fit_rows=lambda: fit_rows(compute, capture, feed, dataset,
                                                    _fit_selection(config, dataset), batching,
                                                    device, shown, transforms))
    capture.arm(shown.calls, shown.where, transforms, compact)
    if interventions:  # the fit pass's applications are not the run's: count from 0
        compute = Intervened(compute.inner, interventions)
    if config.tokens.name != "all" and not shown.follows:
        log.warning("%s=%s has no effect: no stored output of this model has a position axis "
                    "to pool", Attr.TOKENS, config.tokens.name)
    datasets = {**_specs(capture, transforms), **layout.bookkeeping(),
                **feed.bookkeeping(dataset), **compute.bookkeeping()}
    _warn_of_large_rows(transforms, datasets, feed.longest(dataset))
    if config.skip_bad:
        datasets[SKIPPED] = DatasetSpec((), "int64", {Attr.DIMS: ["skipped"]},
                                        compressible=False)
    positions, counted = _positions(compute, feed, dataset, selection, datasets, shown)

    # 4. what it takes: said in the log, and checked against the free disk space
    sample_bytes, position_bytes = _row_bytes(datasets, with_target)
    _log_plan(config, output.path, capture, device, selection, positions, counted, sample_bytes,
              position_bytes)
    estimated = None
    if isinstance(selection, OpenSelection):
        log.info("the number of samples is not known before they are read: free space is not "
                 "checked")
    else:
        left = 0 if positions is None else int(positions[resume[0]:].sum())
        first_bound = _INT64 if positions is not None and not resume[0] else 0  # the bound 0
        estimated = (first_bound + sample_bytes * (len(selection) - resume[0])
                     + position_bytes * left)
        if out.check_free_space:
            output.check_space(estimated)
    if interventions:
        log.info("interventions: %s", "; ".join(interventions.touched()))
    attrs = {**_root_attrs(config, capture, shown, objective_name), **verified,
             **feed.attrs(dataset),
             **({Attr.INTERVENTIONS: json.dumps(interventions.record())} if interventions
                else {}),
             **library_versions(), **{key: dumps(value) for key, value in fingerprints.items()}}
    return Plan(**decided, resume_from=resume[0], resume_rows=resume[1],
                resume_skipped=resume[2], device=device, model=model, family=family,
                dataset=dataset, feed=feed,
                batching=batching, selection=selection, has_target=with_target,
                objective=objective, capture=capture, compute=compute, datasets=datasets,
                attrs=attrs,
                transforms={key: p.stored() for key, p in compact.projections.items()},
                num_positions=None if positions is None or counted else int(positions.sum()),
                most_positions=None if positions is None else int(positions.sum()),
                estimated_bytes=estimated, dry_run_seconds=dry_run_seconds)


def _verified(config: ProbeConfig, family: Family, model: nn.Module, capture: Capture,
              batch) -> dict:
    """The root attrs of the standard names hooked: the architecture they were resolved for,
    each one's module, and the verdicts of the family's checks on the dry run's ``batch``."""
    standard = {name: path for name, path in capture.paths.items() if name != path}
    if not standard:
        return {}
    names = family.names(model)
    if not config.verify:
        verdicts = {"skipped": "verify=false"}
    else:
        attention = any(kind.hook == "attention" for kind in capture.kinds)
        verdicts = family.verify(model, batch, capture.paths, attention)
    return {Attr.ARCHITECTURE: names.architecture, Attr.MODULES: json.dumps(standard),
            Attr.VERIFIED: json.dumps(verdicts)}


_LARGE_ROWS = 1 << 20  # bytes per sample of rows padded to the longest, above which the plan warns


def _warn_of_large_rows(transforms: dict[str, KeyTransform], datasets: dict[str, DatasetSpec],
                        longest: int | None) -> None:
    # rows padded to the longest sample (a padded axis, in the attrs) grow with its square
    for key, transform in transforms.items():
        if Attr.KEYS not in transform.attrs:
            continue
        spec = datasets[key]
        per_sample = spec.row_bytes * ((longest or 1) if transform.per_position else 1)
        if per_sample > _LARGE_ROWS:
            log.warning("%s stores up to %s per sample (%s per %s); tokens=first or last keeps "
                        "one row per sample", key, human_bytes(per_sample),
                        human_bytes(spec.row_bytes), transform.dims[0])


def _specs(capture: Capture, transforms: dict[str, KeyTransform]) -> dict[str, DatasetSpec]:
    """What the store creates for each key: its transform's rows, type and attrs, and the
    datasets beside it (a float8 row's scale)."""
    specs = {}
    for key in capture.keys:
        transform = transforms[key]
        attrs = {**capture.attrs(key), Attr.DIMS: list(transform.dims), **transform.attrs}
        if transform.width is not None:  # projected rows: where their transform lies
            attrs[Attr.COMPONENTS], attrs[Attr.TRANSFORM] = transform.row_shape[0], \
                "/" + transform_path(key)
        spec = DatasetSpec(transform.row_shape, str(capture.dtype).removeprefix("torch."),
                           attrs, per_position=transform.per_position,
                           bounds=bounds_of(transform.attrs))
        specs.update(capture.compact.specs(key, spec))
    return specs


def _stored_transforms(found: FileState | None) -> dict[str, dict]:
    """The projections of the file a run resumes ({} where it starts one)."""
    if found is None:
        return {}
    with open_for_reading(found.path) as f:
        return read_transforms(f)


def _fit_selection(config: ProbeConfig, dataset) -> Selection:
    """The samples pca's axes are fitted on: the first ``reduce_fit_samples`` of the whole
    run's selection (every shard of a sweep takes the same, so fits the same axes)."""
    whole = replace(config, shard=ShardConfig())
    selection = _selection(whole, dataset)
    if isinstance(selection, OpenSelection):
        limit = min(selection.limit or config.reduce_fit_samples, config.reduce_fit_samples)
        return OpenSelection(limit)
    return selection[:config.reduce_fit_samples]


_INT64 = 8  # bytes of an entry of /index, /target or the bounds of rows per position


def _row_bytes(datasets: dict[str, DatasetSpec], with_target: bool) -> tuple[int, int]:
    """The bytes each sample adds to the file (its /index, its /target where the dataset has
    targets, its bound on its rows where they are per position, and every per-sample
    dataset's row) and each stored position adds (every per-position dataset's row)."""
    per_position = any(spec.per_position for spec in datasets.values())
    sample = _INT64 * (1 + with_target + per_position) + sum(
        spec.row_bytes for spec in datasets.values() if not spec.per_position)
    return sample, sum(spec.row_bytes for spec in datasets.values() if spec.per_position)


def _positions(compute: Pass, feed: Feed, dataset: Dataset, selection: Selection,
               datasets: dict[str, DatasetSpec], shown: DryRun
               ) -> tuple[np.ndarray | None, str]:
    """The rows each sample stores where they are one per position (None: they are not, or
    the samples are not known before the run), and how they are known: "" exactly, "at most "
    (a pass that adds rows as it goes), or "about " (a feed that cannot count them before the
    run: each sample taken as long as the dry run's)."""
    if not any(spec.per_position for spec in datasets.values()):
        return None, ""
    stored, said = feed.stored_positions(dataset, selection), ""
    if stored is None and not isinstance(selection, OpenSelection) and \
            shown.layout.lengths is not None:
        stored, said = np.full(len(selection), int(shown.layout.lengths.max())), "about "
    positions, exact = compute.positions(stored)
    return positions, said or ("" if exact else "at most ")


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


def _selection(config: ProbeConfig, dataset) -> Selection:
    """The samples this job takes: by ``limit``, ``subset`` and ``shard``."""
    shard = config.shard
    try:
        size = len(dataset)
    except TypeError:  # read as it comes: its length is not known before its end
        size = None
    if size is not None:
        if config.limit is not None and config.limit > size:
            log.warning("limit=%d is beyond the dataset's %d samples: the run takes all %d",
                        config.limit, size, size)
        return select_indices(size, config.limit, shard.index, shard.count,
                              subset=config.subset.name, seed=config.seed)
    if config.subset is Subset.random:
        raise ConfigError("subset=random picks samples from the whole dataset, which one read "
                          "as it comes cannot; use subset=first, or read it whole")
    if config.skip_bad:
        raise ConfigError("dataset.on_error=skip is not supported for a dataset read as it "
                          "comes; read it whole, or fix the samples")
    check_selection(config.limit, shard.index, shard.count)
    return OpenSelection(config.limit, shard.index, shard.count)


def _resume_point(output: Output, selection: Selection,
                  batching: Batching) -> tuple[int, int, int]:
    """Where a run resumes: (samples of the selection done, rows kept, samples left out kept).
    The committed rows and left-out samples cover the selection's first samples. A group's
    batches are made from its start: a run resumes there, so that they are the same batches."""
    found = output.found
    rows, skipped = found.num_committed, int(found.attrs.get(Attr.NUM_SKIPPED, 0))
    done = rows + skipped
    start = done - done % batching.group
    if start == done:
        return done, rows, skipped
    if not skipped:
        return start, start, 0
    # rows and left-out samples interleave: keep those before the group's first sample
    return (start, *output.rows_before(selection[start], rows, skipped))


def _batching(config: ProbeConfig, feed: Feed, device: torch.device) -> Batching:
    if config.batch_tokens is not None and not feed.positions:
        raise ConfigError(f"batch_tokens={config.batch_tokens} is a budget of padded positions "
                          "per batch, for batches of sequences; use batch_size for this dataset")
    return Batching(config.batch_size, config.batch_tokens,
                    bucket=config.bucket_by_length and feed.positions,
                    num_workers=config.num_workers, pin_memory=device.type == "cuda",
                    skip_bad=config.skip_bad)


def _log_plan(config: ProbeConfig, path: Path, capture: Capture, device: torch.device,
              selection: Selection, positions, counted: str, sample_bytes: int,
              position_bytes: int) -> None:
    for name in config.layers:
        if is_glob(name):
            log.info("layers: %s matches %s", name, ", ".join(match_layers(capture.layers, name)))
    if isinstance(selection, OpenSelection):
        size = f"samples as they come, {human_bytes(position_bytes)} a position"
    elif positions is None:
        size = f"{len(selection)} samples of {human_bytes(sample_bytes)}"
    else:
        size = (f"{len(selection)} samples, {counted}{int(positions.sum())} positions of "
                f"{human_bytes(position_bytes)}")
    log.info("model %s on %s; %d layers x %s; %s -> %s", type(capture.model).__name__, device,
             len(capture.layers), [kind.hook for kind in capture.kinds], size, path)
    if config.output.compression.name == "lzf":
        log.info("output.compression=lzf: only h5py reads lzf; the HDF5 C tools, MATLAB, Julia "
                 "and R print DATA {} for each compressed chunk, without an error (h5dump exits "
                 "0, h5diff 2). Use gzip for files that leave Python")


_NO_INTERVENTIONS = {"interventions": None}  # the fingerprint of a run without any


def _require_same_inputs(found: FileState, fingerprints: dict) -> None:
    # the same config made from another model or other data would give other values, or under
    # interventions whose vectors or sources changed
    for key, what in ((Attr.DATA_FINGERPRINT, "dataset"), (Attr.MODEL_FINGERPRINT, "model"),
                      (Attr.INTERVENTION_FINGERPRINT, "interventions")):
        stored, current = loads(found.attrs.get(key)), fingerprints.get(key)
        if key == Attr.INTERVENTION_FINGERPRINT:  # a run without any records none
            stored, current = stored or _NO_INTERVENTIONS, current or _NO_INTERVENTIONS
        elif stored is None:  # written before fingerprints were kept
            log.warning("%s records no %s fingerprint; assuming the %s is the same", found.path,
                        what, what)
            continue
        said = changes(stored, current)
        if said:
            started = "written" if found.complete else "started"
            raise OutputError(
                f"the {what} changed since {str(found.path)!r} was {started} ({'; '.join(said)}) "
                "although the config is the same; set output.overwrite=true to start again, or "
                "choose another output.path"
            )


def _root_attrs(config: ProbeConfig, capture: Capture, shown: DryRun,
                objective_name: str | None) -> dict:
    attrs = {Attr.LAYERS: list(capture.layers), Attr.HOOKS: [k.hook for k in capture.kinds],
             Attr.SHARD_INDEX: config.shard.index, Attr.SHARD_COUNT: config.shard.count}
    if objective_name is not None:
        attrs[Attr.OBJECTIVE] = objective_name
    if shown.follows:
        attrs[Attr.TOKENS] = config.tokens.name
    for kind in capture.kinds:
        attrs.update(kind.root_attrs(capture.layers))
    return attrs
