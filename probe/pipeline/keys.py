"""What each stored key becomes, in one place: the steps from a captured tensor to the rows
stored (pool the positions, reduce, cast), on tensors for the hooks and on shapes for the dry
run and ``probe.layers``.

    transform = key_transform(key, raw_shape, axes=..., layout=..., follows=..., pool=...,
                              reduce=...)
    rows = transform(value, layout)       # what the store writes, on the value's device
    transform.row_shape, transform.dims   # its shape and axis names, without computing it

A key whose value follows the batch's row layout (probe.data.layouts) is pooled by that
layout, along the axis its capture kind says (``Axes``); any other key is stored a row per
sample, as captured. The reduce then applies to what is left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from probe.config.schema import Reduce, Tokens
from probe.data.layouts import POSITIONS_FIRST, SAMPLE_ROWS, Axes, RowLayout, plain_dims
from probe.errors import ConfigError
from probe.file.format import split_key

__all__ = ["KeyTransform", "key_transform", "transforms_for", "reduce_tensor"]


@dataclass(frozen=True)
class KeyTransform:
    """How the captured tensor of one key becomes its stored rows."""

    key: str
    reduce: Reduce  # the reduce as it applies: none where the rows have no axes to pool
    pool: Tokens  # how the layout's positions are pooled (the config's tokens)
    # the value's axes as the layout reads them, where it follows the batch's positions;
    # None: a row per sample, as captured
    axes: Axes | None
    per_position: bool  # one row per kept position, else one per sample
    dtype: torch.dtype | None  # the stored type; None keeps the captured tensor's
    row_shape: tuple[int, ...]  # one stored row
    dims: tuple[str, ...]  # the name of each stored axis, rows first
    attrs: Mapping = field(default_factory=dict)  # what the layout did to the rows, said
    # the trailing axes of a row that one float8 scale covers: all of them, or an attention
    # pattern's keys (a scale per query row)
    scaled_axes: int = 0
    # reduce=pca|srp: the width of a row before its projection on row_shape[0] values
    width: int | None = None

    def __call__(self, value: torch.Tensor, layout: RowLayout = SAMPLE_ROWS) -> torch.Tensor:
        """The rows of a captured (B, ...) tensor of a batch of ``layout``, before what the
        caller does to store them (project, cast or encode, copy: probe.pipeline.compact)."""
        if self.axes is not None:
            value = layout.select(self.key, value, self.axes, self.pool)
        return reduce_tensor(value, self.reduce)


def key_transform(key: str, raw_shape: tuple[int, ...], *, reduce: Reduce,
                  axes: Axes = POSITIONS_FIRST, layout: RowLayout = SAMPLE_ROWS,
                  follows: bool = False, pool: Tokens = Tokens.all,
                  dtype: torch.dtype | None = None, channels_first: bool = True,
                  components: int | None = None) -> KeyTransform:
    """The transform of ``key``, whose captured tensor has ``raw_shape`` (batch axis first)
    with ``axes`` (its capture kind's, with the most positions a sample has), and
    ``follows`` the batches' ``layout`` or not; ``pool`` is the config's ``tokens``;
    ``channels_first``: whether a row of two axes is (channel, length) as a 1-d convolution
    gives it, or (token, feature) as a transformer's layers do (probe.pipeline.modules);
    ``components``: the values reduce=pca|srp projects a row on.

    Raises:
        ConfigError: a pool or reduce that the layout's rows or the kind's values cannot take,
            or more components than a row has values.
    """
    if reduce is not Reduce.none and axes.unreduced:
        raise ConfigError(f"reduce={reduce.name} on {key}: {axes.unreduced}; leave the layer "
                          f"out of the reduce ('reduce_by_layer={{{split_key(key)[0]}:none}}')")
    shape, attrs = tuple(raw_shape[1:]), {}
    if follows:
        rows, dims, per_position, attrs = layout.stored(key, shape, axes, pool, reduce)
    else:  # a row per sample, its axes named by the kind, or as PyTorch's layers lay them
        rows, dims, per_position = shape, plain_dims(len(shape)), False
        if axes.names is not None:
            dims = ("sample", *axes.names)
        elif len(rows) == 2 and not channels_first:
            dims = ("sample", "token", "feature")
    scaled_axes = 1 if axes.keys else len(rows)
    width = None
    if reduce in (Reduce.mean, Reduce.max) and len(rows) > 1:
        rows, dims = rows[:1], dims[:2]
    elif reduce.projects:
        width = math.prod(rows)
        if components is None or not 0 < components <= width:
            raise ConfigError(
                f"reduce={reduce.name} with reduce_components={components} on {key}, whose rows "
                f"have {width} values: set reduce_components to 1 to {width}")
        rows, dims, scaled_axes = (components,), (dims[0], "component"), 1
    elif reduce is Reduce.flatten and len(rows) > 1:
        rows, dims = (math.prod(rows),), (dims[0], "feature")
    elif reduce is not Reduce.none:
        reduce = Reduce.none  # nothing to pool or flatten: the attr says what was done
    return KeyTransform(key, reduce, pool, axes if follows else None, per_position, dtype,
                        rows, dims, attrs, scaled_axes, width)


def transforms_for(shapes: Mapping[str, tuple[int, ...]], axes: Mapping[str, Axes],
                   follows: set[str], reduces: Mapping[str, Reduce], *, layout: RowLayout,
                   pool: Tokens, dtype: torch.dtype | None, channels_first: set[str] = frozenset(),
                   longest: int | None = None, components: int | None = None
                   ) -> dict[str, KeyTransform]:
    """The transform of every key of a dry run: its raw ``shapes``, its capture kind's
    ``axes``, the keys that follow the batches' ``layout``, each layer's reduce, the config's
    ``tokens`` as ``pool``, the layers whose rows of two axes are (channel, length), and the
    most positions a sample has (``longest``, where values have an axis of them to pad).

    Raises:
        ConfigError: a pool or reduce that the layout's rows cannot take.
    """
    return {key: key_transform(key, shape, reduce=reduces[split_key(key)[0]],
                               axes=replace(axes[key], longest=longest), layout=layout,
                               follows=key in follows, pool=pool, dtype=dtype,
                               channels_first=split_key(key)[0] in channels_first,
                               components=components)
            for key, shape in shapes.items()}


def reduce_tensor(tensor: torch.Tensor, how: Reduce) -> torch.Tensor:
    """Reduce a (N, C, ...) tensor over its axes after C (mean, max) or flatten it to (N, -1)
    (flatten, and pca or srp, whose projection follows: probe.pipeline.compact)."""
    if how is Reduce.none:
        return tensor
    if how is Reduce.flatten or how.projects:
        return tensor.flatten(1)
    if tensor.dim() <= 2:
        return tensor
    axes = tuple(range(2, tensor.dim()))
    return tensor.mean(axes) if how is Reduce.mean else tensor.amax(axes)
