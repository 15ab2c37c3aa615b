"""What each stored key becomes, in one place: the steps from a captured tensor to the rows
stored (pool the positions, reduce, cast), on tensors for the hooks and on shapes for the dry
run and ``probe.layers``.

    transform = key_transform(key, raw_shape, layout=..., follows=..., pool=..., reduce=...)
    rows = transform(value, layout)       # what the store writes, on the value's device
    transform.row_shape, transform.dims   # its shape and axis names, without computing it

A key that follows the batch's row layout (probe.data.layouts) is pooled by that layout; any
other key is stored a row per sample. The reduce then applies to what is left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from probe.config.schema import Hook, Reduce, Tokens
from probe.data.layouts import SAMPLE_ROWS, RowLayout
from probe.errors import ConfigError
from probe.file.format import parse_kind, split_key

PATTERN_KIND = Hook.attention.kind

__all__ = ["KeyTransform", "key_transform", "transforms_for", "reduce_tensor"]


@dataclass(frozen=True)
class KeyTransform:
    """How the captured tensor of one key becomes its stored rows."""

    reduce: Reduce  # the reduce as it applies: none where the rows have no axes to pool
    pool: Tokens | None  # how the layout's positions are pooled; None: the key follows none
    per_position: bool  # one row per kept position, else one per sample
    dtype: torch.dtype | None  # the stored type; None keeps the captured tensor's
    row_shape: tuple[int, ...]  # one stored row
    dims: tuple[str, ...]  # the name of each stored axis, rows first
    # an attention pattern's: the keys each row holds where the layout pads them (its
    # positions at most), else None; patterns are not None here
    keys: int | None = None
    pattern: bool = False  # an attention pattern (B, heads, queries, keys), as the layout stores
    layer: str = ""  # whose values these are: the layout says which of its rows they follow

    def __call__(self, value: torch.Tensor, layout: RowLayout = SAMPLE_ROWS) -> torch.Tensor:
        """The stored rows of a captured (B, ...) tensor of a batch of ``layout`` (cast by
        the caller, which copies)."""
        layout = layout.rows_for(self.layer)
        if self.pattern:
            return layout.select_pattern(value, self.pool, self.keys)
        if self.pool is not None:
            value = layout.select(value, self.pool)
        return reduce_tensor(value, self.reduce)


def key_transform(key: str, raw_shape: tuple[int, ...], *, reduce: Reduce,
                  layout: RowLayout = SAMPLE_ROWS, follows: bool = False,
                  pool: Tokens = Tokens.all, dtype: torch.dtype | None = None,
                  channels_first: bool = True, keys: int | None = None) -> KeyTransform:
    """The transform of ``key``, whose captured tensor has ``raw_shape`` (batch axis first)
    and ``follows`` the batches' ``layout`` or not; ``pool`` is the config's ``tokens``;
    ``channels_first``: whether a row of two axes is (channel, length) as a 1-d convolution
    gives it, or (token, feature) as a transformer's layers do (probe.pipeline.modules);
    ``keys``: the most positions a sample has (an attention pattern's keys are padded to it).

    Raises:
        ConfigError: a pool or reduce that the layout's rows cannot take.
    """
    layer = split_key(key)[0]
    layout = layout.rows_for(layer)
    if parse_kind(split_key(key)[1])[0] == PATTERN_KIND:
        return _pattern_transform(key, raw_shape, reduce, layout, pool, dtype, keys)
    own = layout if follows else SAMPLE_ROWS
    rows, dims, per_position = own.stored(key, tuple(raw_shape[1:]), pool, reduce)
    if not follows and len(rows) == 2 and not channels_first:
        dims = ("sample", "token", "feature")
    if reduce in (Reduce.mean, Reduce.max) and len(rows) > 1:
        rows, dims = rows[:1], dims[:2]
    elif reduce is Reduce.flatten and len(rows) > 1:
        rows, dims = (math.prod(rows),), (dims[0], "feature")
    elif reduce is not Reduce.none:
        reduce = Reduce.none  # nothing to pool or flatten: the attr says what was done
    return KeyTransform(reduce, pool if follows else None, per_position, dtype, rows, dims,
                        layer=layer)


def _pattern_transform(key: str, raw_shape: tuple[int, ...], reduce: Reduce,
                       layout: RowLayout, pool: Tokens, dtype: torch.dtype | None,
                       keys: int | None) -> KeyTransform:
    # an attention pattern is stored as the layout lays its queries and keys out, unreduced
    if reduce is not Reduce.none:
        raise ConfigError(
            f"reduce={reduce.name} on {key}: an attention pattern is stored as it is (one row "
            "per query, or one per sample with tokens=first|last|mean); leave the layer out of "
            f"the reduce ('reduce_by_layer={{{split_key(key)[0]}:none}}')")
    rows, dims, per_position = layout.stored_pattern(key, tuple(raw_shape[1:]), pool, keys)
    return KeyTransform(Reduce.none, pool, per_position, dtype, rows, dims, keys=keys,
                        pattern=True, layer=split_key(key)[0])


def transforms_for(shapes: Mapping[str, tuple[int, ...]], follows: set[str],
                   reduces: Mapping[str, Reduce], *, layout: RowLayout, pool: Tokens,
                   dtype: torch.dtype | None, channels_first: set[str] = frozenset(),
                   keys: int | None = None) -> dict[str, KeyTransform]:
    """The transform of every key of a dry run: its raw ``shapes``, the keys that follow the
    batches' ``layout``, each layer's reduce, the config's ``tokens`` as ``pool``, the
    layers whose rows of two axes are (channel, length), and the most positions a sample has
    (``keys``, for attention patterns).

    Raises:
        ConfigError: a pool or reduce that the layout's rows cannot take.
    """
    return {key: key_transform(key, shape, reduce=reduces[split_key(key)[0]], layout=layout,
                               follows=key in follows, pool=pool, dtype=dtype,
                               channels_first=split_key(key)[0] in channels_first, keys=keys)
            for key, shape in shapes.items()}


def reduce_tensor(tensor: torch.Tensor, how: Reduce) -> torch.Tensor:
    """Reduce a (N, C, ...) tensor over its axes after C (mean, max) or flatten it to (N, -1)."""
    if how is Reduce.none:
        return tensor
    if how is Reduce.flatten:
        return tensor.flatten(1)
    if tensor.dim() <= 2:
        return tensor
    axes = tuple(range(2, tensor.dim()))
    return tensor.mean(axes) if how is Reduce.mean else tensor.amax(axes)
