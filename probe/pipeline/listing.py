"""What ``python -m probe.layers`` lists: every module of a model, with the shape it stores for
one sample (one token, for rows per token) and the bytes that sample (token) adds to a file,
made by the same per-key transform as a run's (probe.pipeline.keys); the row layout in words,
and a two-tower model's tower of each module.

    notes, rows = layer_table(cfg)    # rows[0] is the header
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.checks import read_config
from probe.config.device import resolve_device
from probe.config.schema import Dtype, Reduce, Tokens
from probe.data.feed import Batch
from probe.data.layouts import POSITIONS_FIRST, SAMPLE_ROWS, Axes
from probe.data.tensors import feed_for
from probe.errors import ConfigError
from probe.families.base import Family
from probe.families.build import build_dataset, build_model
from probe.families.registry import family_for
from probe.families.towers import tower_of
from probe.file.sizes import human_bytes
from probe.pipeline.compact.planned import check_compact
from probe.pipeline.fingerprint import model_fingerprint
from probe.pipeline.interventions import interventions_for
from probe.pipeline.keys import key_transform
from probe.pipeline.kinds import ATTENTION
from probe.pipeline.modules import describe_layers
from probe.pipeline.passes import pass_for
from probe.pipeline.reduce import resolve_reduces

__all__ = ["layer_table"]


def layer_table(cfg: DictConfig) -> tuple[list[str], list[tuple[str, ...]]]:
    """Lines about the row layout, and rows of (name, type, stored shape, bytes per sample or
    per token, and for a two-tower model its tower), a header first.

    A model that reads other data than the config's dataset (a language model and the default
    images, a 32 px ViT and 224 px images), or a two-tower model (both towers shown), is shown
    on a batch of its family's own making.

    Raises:
        ProbeError: a model, dataset or reduce that cannot work.
    """
    config = read_config(cfg)
    check_compact(config)
    model = build_model(cfg)
    family = family_for(cfg.model, model)
    model, device = family.place(model, resolve_device(config.device), config.device)
    # a model of several towers shows them all on its own batch, where it makes one
    own = family.example_batch(model) if family.towers else None
    batch, longest = (own, None) if own is not None else _first_sample(cfg, family, model)
    try:
        layout, infos, attention = _described(family, model, batch, device)
    except (RuntimeError, ValueError):  # the data does not suit it (224 px for a 32 px ViT)
        batch, longest = family.example_batch(model), None
        if batch is None:
            raise
        layout, infos, attention = _described(family, model, batch, device)
    reduces = resolve_reduces([info.name for info in infos], config.reduce,
                              config.reduce_by_layer)
    # the rows a run of this config stores (a generating run adds the answer's)
    compute = pass_for(config, cfg.model, family, model, capture=None)
    layout = compute.rows(layout)
    components = config.reduce_components
    per_token = layout.lengths is not None and config.tokens is Tokens.all
    towers = family.towers
    rows = [("name", "type", "output shape", f"bytes/{'tok' if per_token else 'sample'}",
             *(("tower",) if towers else ()))]
    for info in infos:
        tower = (tower_of(info.name, towers) or "both",) if towers else ()
        if info.shape is None:
            rows.append((info.name, info.type, "(not run)", "-", *tower))
            continue
        shape = _shown_shape(f"{info.name}/output", info.shape, layout, config.tokens,
                             reduces[info.name], components)
        note = f" x{info.calls} calls" if info.calls > 1 else ""
        rows.append((info.name, info.type, f"{shape}{note}",
                     human_bytes(_row_bytes(shape, config.output.dtype, len(shape))), *tower))
        if info.name in attention:  # hooks=[attention] stores its pattern
            pattern = _pattern_shape(info.name, layout, attention[info.name], config.tokens,
                                     longest)
            size = ("-" if isinstance(pattern, str) else
                    human_bytes(_row_bytes(pattern, config.output.dtype, 1)))
            rows.append((f"{info.name}/attention", f"{attention[info.name][0]} heads",
                         str(pattern), size, *tower))
    names = family.names(model)
    rows = _with_standard_names(rows, names)
    notes = [layout.describe(), _names_note(names)]
    most, exact = compute.positions(None if layout.lengths is None else
                                    layout.lengths.numpy())
    if most is not None and not exact:
        notes.append(f"the first sample: at most {int(most[0])} rows")
    notes.extend(_compact_notes(config))
    notes.extend(_interventions(cfg, config, model, family))
    return [note for note in notes if note], rows


def _with_standard_names(rows: list[tuple[str, ...]], names) -> list[tuple[str, ...]]:
    """The rows with a last column of each module's standard name (probe.families.names),
    where the model has them."""
    if names is None or names.refused is not None:
        return rows
    standard = {path: name for name, path in names.table().items()}
    widened = [(*rows[0], "standard name")]
    for row in rows[1:]:
        path, _, kind = row[0].partition("/")
        name = standard.get(path, "")
        widened.append((*row, f"{name}/{kind}" if name and kind else name))
    return widened


def _names_note(names) -> str:
    if names is None:
        return ""
    if names.refused is not None:
        return f"standard names: none; {names.refused}"
    stacks = ", ".join(f"{prefix + '.' if prefix else ''}blocks.0-{stack_depth - 1}"
                       for prefix in names.stacks
                       if (stack_depth := names.depth(prefix)))
    return (f"standard names of {names.architecture} (a run stores them under these names): "
            f"{stacks}; blocks.-1 is the last block, blocks.50% the one half-way, blocks.* "
            "every one")


def _interventions(cfg: DictConfig, config, model: nn.Module, family: Family) -> list[str]:
    # what +intervene= changes, checked as a run checks it
    if not config.intervene:
        return []
    interventions = interventions_for(cfg, model, family,
                                      generating=bool(config.generate.max_new_tokens),
                                      model_fingerprint=model_fingerprint(model))
    interventions.close()
    return ["interventions (a module after one stores the changed model's values; the "
            "module itself its changed output): " + "; ".join(interventions.touched())]


def _first_sample(cfg: DictConfig, family: Family, model: nn.Module
                  ) -> tuple[Batch, int | None]:
    # the config's first sample, or the family's own batch where the model cannot read it;
    # and the most positions a sample of the dataset has
    dataset = build_dataset(cfg)
    feed = feed_for(dataset)
    try:
        family.check(model, feed, {})
        return (feed.for_model(family.output_lengths(model)).dry_batches(dataset, 0)[0],
                feed.longest(dataset))
    except ConfigError:
        batch = family.example_batch(model)
        if batch is None:
            raise
        return batch, None


def _described(family: Family, model: nn.Module, batch: Batch, device: torch.device):
    """The batch's layout, every module's shape, and the attention modules (name -> heads,
    queries, keys), where the family gives patterns."""
    on_device = batch.to(device)
    layout = family.layout(model, on_device)
    attention: dict[str, tuple[int, int, int]] = {}

    # the attention modules that the standard names know are marked, whether they call the
    # attention interface or compute their own weights (probe.families.hf_own_weights)
    names = family.names(model)
    modules = dict(model.named_modules())
    known = {} if names is None or names.refused is not None else {
        modules[path]: path for name, path in names.table().items()
        if name.endswith((".attention", ".cross_attention"))}

    def forward():
        try:
            patterns = family.patterns(model, known, None)
        except ConfigError:  # patterns are not to be had: no module is marked
            return family.forward(model, on_device)
        with patterns as seen:
            output = family.forward(model, on_device)
        attention.update(seen)
        return output

    return layout, describe_layers(model, forward), attention


def _pattern_shape(name: str, layout, pattern: tuple[int, int, int], tokens: Tokens,
                   longest: int | None) -> tuple[int, ...] | str:
    # what hooks=[attention] stores for a sample (a token), as a run's transform would
    try:
        return _stored_shape(f"{name}/{ATTENTION.kind}", pattern, layout, tokens, Reduce.none,
                             replace(ATTENTION.axes, longest=longest))
    except ConfigError:  # no bound on the keys yet: the dataset's max_length gives it
        return f"({pattern[0]}, dataset.max_length)"


def _stored_shape(key: str, shape: tuple[int, ...], layout, tokens: Tokens, reduce: Reduce,
                  axes: Axes = POSITIONS_FIRST, components: int | None = None
                  ) -> tuple[int, ...]:
    raw = (1, *shape)
    follows = layout.follows(key, raw, axes)
    return key_transform(key, raw, reduce=reduce, axes=axes, layout=layout, follows=follows,
                         pool=tokens, components=components).row_shape


def _shown_shape(key: str, shape: tuple[int, ...], layout, tokens: Tokens, reduce: Reduce,
                 components: int | None) -> tuple[int, ...]:
    """The shape a run stores; where the layer refuses the reduce (a pool of token features,
    more components than values), as it would be captured."""
    for tried, how in ((layout, reduce), (SAMPLE_ROWS, reduce), (SAMPLE_ROWS, Reduce.none)):
        try:
            return _stored_shape(key, shape, tried, tokens, how, components=components)
        except ConfigError:
            continue
    return shape


def _row_bytes(shape: tuple[int, ...], dtype: Dtype, scaled_axes: int) -> int:
    """Bytes a stored row takes: its values, and float8's scales (float32, one per the row's
    last ``scaled_axes`` axes)."""
    values = dtype.torch.itemsize * math.prod(shape)
    if dtype is not Dtype.float8:
        return values
    return values + 4 * math.prod(shape[:len(shape) - scaled_axes])


def _compact_notes(config) -> list[str]:
    notes = []
    if config.output.dtype is Dtype.float8:
        notes.append("output.dtype=float8: a byte per value and a float32 scale per row "
                     "(bytes/row include it)")
    if config.reduce.projects:
        fit = (f", fitted on the first {config.reduce_fit_samples} samples"
               if config.reduce is Reduce.pca else "")
        notes.append(f"reduce={config.reduce.name}: each row projected on "
                     f"{config.reduce_components} values{fit}")
    return notes
