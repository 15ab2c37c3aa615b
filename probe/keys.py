"""What each stored key becomes, in one place: the steps from a captured tensor to the rows
stored (select positions, pool, reduce, cast), on tensors for the hooks and on shapes for the
dry run and ``probe.layers``.

    transform = key_transform(raw_shape, layout, tokens, reduce, dtype, per_position=...)
    rows = transform(value, layout)       # what the store writes, on the value's device
    transform.row_shape, transform.dims   # its shape and axis names, without computing it

An output with a token axis (``layout`` given: language models' tokens, vision transformers'
class, register and patch tokens) gives one row per kept position (``per_position``, with
``tokens=all``), or per sample (``first``, ``last``, ``mean``; a vision transformer's
``all`` keeps its (tokens, features) rows, and ``patches`` lays its patch tokens out on the
patch grid, (features, rows, columns), as a conv map is); then the reduce applies to what is
left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from probe.errors import ConfigError
from probe.format import Reduce, Tokens, split_key

__all__ = ["KeyTransform", "key_transform", "transforms_for", "select_tokens", "patch_map",
           "reduce_tensor"]


@dataclass(frozen=True)
class KeyTransform:
    """How the captured tensor of one key becomes its stored rows."""

    reduce: Reduce  # the reduce as it applies: none where the rows have no axes to pool
    pool: Tokens | None  # how a token layout's positions are pooled; None: it has none
    per_position: bool  # one row per kept position (rows per token), else one per sample
    dtype: torch.dtype | None  # the stored type; None keeps the captured tensor's
    row_shape: tuple[int, ...]  # one stored row
    dims: tuple[str, ...]  # the name of each stored axis, rows first
    prefix: int = 0  # tokens=patches: the special tokens before the patches
    grid: tuple[int, int] | None = None  # tokens=patches: the patch grid (rows, columns)

    def __call__(self, value: torch.Tensor, keep: torch.Tensor | None = None,
                 row_sample: torch.Tensor | None = None) -> torch.Tensor:
        """The stored rows of a captured (B, ...) tensor (cast by the caller, which copies);
        ``keep`` marks the kept positions of a token layout; ``row_sample``, the sample of
        each of its rows where a sample spans several (TokenLayout.row_sample)."""
        if self.pool is Tokens.patches:
            value = patch_map(value, self.prefix, self.grid)
        elif self.pool is not None:
            value = select_tokens(value, keep, self.pool, row_sample)
        return reduce_tensor(value, self.reduce)


def key_transform(key: str, raw_shape: tuple[int, ...], *, reduce: Reduce,
                  dtype: torch.dtype | None = None, tokens: Tokens | None = None,
                  per_position: bool = False, axis: str = "token", prefix: int = 0,
                  grid: tuple[int, int] | None = None) -> KeyTransform:
    """The transform of ``key``, whose captured tensor has ``raw_shape`` (batch axis first).

    ``tokens`` (None for a tensor without a token axis) pools a token layout whose positions
    are named ``axis``; ``per_position`` stores its kept positions as rows (``tokens=all`` of
    a sequence with a mask of real positions); ``prefix`` and ``grid`` say where a vision
    transformer's patches are, for ``tokens=patches``.

    Raises:
        ConfigError: a reduce that would pool a token layout's features; tokens=patches on a
            layout without a patch grid.
    """
    rows = tuple(raw_shape[1:])
    per_position = per_position and tokens is Tokens.all
    if tokens is None:
        dims = _plain_dims(len(rows))
    elif tokens is Tokens.all:
        if reduce in (Reduce.mean, Reduce.max):
            raise ConfigError(_feature_pooling(key, reduce, per_position, grid is not None))
        rows, dims = ((rows[1:], (axis, *_features(len(rows) - 1))) if per_position else
                      (rows, ("sample", axis, *_features(len(rows) - 1))))
    elif tokens is Tokens.patches:
        if grid is None or per_position or len(rows) != 2 or rows[0] != prefix + math.prod(grid):
            raise ConfigError(
                f"tokens=patches on {key}, a token layout of {rows[0]} {axis}s without a patch "
                "grid: patches are a vision transformer's; use tokens=all, first, last or mean")
        rows, dims = (rows[1], *grid), ("sample", "feature", "height", "width")
    else:
        rows, dims = rows[1:], ("sample", *_features(len(rows) - 1))
    if reduce in (Reduce.mean, Reduce.max) and len(rows) > 1:
        rows, dims = rows[:1], dims[:2]
    elif reduce is Reduce.flatten and len(rows) > 1:
        rows, dims = (math.prod(rows),), (dims[0], "feature")
    elif reduce is not Reduce.none:
        reduce = Reduce.none  # nothing to pool or flatten: the attr says what was done
    return KeyTransform(reduce, tokens, per_position, dtype, rows, dims, prefix, grid)


def transforms_for(shapes: Mapping[str, tuple[int, ...]], layouts: set[str],
                   reduces: Mapping[str, Reduce], *, pool: Tokens, dtype: torch.dtype | None,
                   positions: bool, axis: str = "token", prefix: int = 0,
                   grid: tuple[int, int] | None = None) -> dict[str, KeyTransform]:
    """The transform of every key of a dry run: its raw ``shapes``, which keys are token
    ``layouts``, each layer's reduce, how ``pool`` pools the layouts' positions (the tokens
    key); ``positions``: the batches mark their real positions, so ``all`` gives one row per
    position; ``prefix`` and ``grid``: where the layout's patches are (tokens=patches).

    Raises:
        ConfigError: a reduce that would pool a token layout's features.
    """
    return {key: key_transform(key, shape, reduce=reduces[split_key(key)[0]], dtype=dtype,
                               tokens=pool if key in layouts else None, axis=axis,
                               per_position=positions, prefix=prefix, grid=grid)
            for key, shape in shapes.items()}


def _plain_dims(axes: int) -> tuple[str, ...]:
    # the axes of a tensor without a token axis, as PyTorch's layers lay them out
    if axes <= 1:
        return ("sample", "feature")[: axes + 1]
    spatial = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
    return ("sample", "channel", *spatial.get(axes - 1, tuple(f"axis{n}" for n in
                                                              range(2, axes + 1))))


def _features(axes: int) -> tuple[str, ...]:
    return ("feature",) if axes == 1 else tuple(f"feature{n}" for n in range(axes))


def _feature_pooling(key: str, reduce: Reduce, per_position: bool, patches: bool) -> str:
    # the axes after a token layout's token axis are its features, not space
    rows, instead = (("whose rows are its tokens (tokens, features)", "tokens=mean (or first, "
                      "last)") if per_position else
                     ("(N, tokens, features)", "tokens=first (the class token), last or mean"
                      + (", or tokens=patches to pool the patch grid" if patches else "")))
    return (f"reduce={reduce.name} on {key}, a token layout {rows}: it would {reduce.name}-pool "
            f"the feature axis; pool the tokens instead with {instead}, or leave this layer out "
            f"of the reduce ('reduce_by_layer={{{split_key(key)[0]}:none}}')")


def select_tokens(value: torch.Tensor, keep: torch.Tensor | None, how: Tokens,
                  row_sample: torch.Tensor | None = None) -> torch.Tensor:
    """The rows ``how`` asks for of a (B, L, ...) tensor.

    ``all``: (number of kept positions, ...) in batch order, or the tensor itself when ``keep``
    is None; ``first``, ``last``, ``mean``: (B, ...). The mean is taken in float32 at least.
    With ``row_sample`` (the sample of each of the B rows, in order, where a sample spans
    several), ``first``, ``last`` and ``mean`` pool each sample's kept positions over its rows.
    """
    if row_sample is not None and keep is not None:
        return _by_sample(value, keep, how, row_sample)
    if keep is None:
        if how is Tokens.all:
            return value
        if how is Tokens.mean:
            return value.mean(1, dtype=torch.promote_types(value.dtype, torch.float32))
        return value[:, 0] if how is Tokens.first else value[:, -1]
    if value.shape[:2] != keep.shape:
        raise ValueError(f"a token layout of shape {tuple(value.shape)} for a batch whose tokens "
                         f"are {tuple(keep.shape)}")
    if how is Tokens.all:
        return value[keep]
    rows = torch.arange(len(value), device=value.device)
    if how is Tokens.first:
        return value[rows, keep.int().argmax(1)]
    if how is Tokens.last:
        return value[rows, keep.shape[1] - 1 - keep.flip(1).int().argmax(1)]
    weights = keep.to(torch.promote_types(value.dtype, torch.float32))
    weights = weights / weights.sum(1, keepdim=True)
    return torch.einsum("bl...,bl->b...", value.to(weights.dtype), weights)


def patch_map(value: torch.Tensor, prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """A vision transformer's (B, prefix + rows * columns, D) tokens as its patches alone, on
    their grid: (B, D, rows, columns), patches in row-major order as the models lay them."""
    patches = value[:, prefix:]
    return patches.unflatten(1, grid).movedim(-1, 1)


def _by_sample(value: torch.Tensor, keep: torch.Tensor, how: Tokens,
               row_sample: torch.Tensor) -> torch.Tensor:
    # the kept positions of all rows, in order: each sample's form one block
    rows = value[keep]
    if how is Tokens.all:
        return rows
    assert bool((row_sample[1:] >= row_sample[:-1]).all()), "a sample's rows are consecutive"
    samples = int(row_sample.max()) + 1
    lengths = torch.zeros(samples, dtype=torch.long, device=value.device).index_add_(
        0, row_sample, keep.sum(1))
    ends = lengths.cumsum(0)
    if how is Tokens.first:
        return rows[ends - lengths]
    if how is Tokens.last:
        return rows[ends - 1]
    dtype = torch.promote_types(value.dtype, torch.float32)
    owner = torch.repeat_interleave(torch.arange(samples, device=value.device), lengths)
    sums = torch.zeros((samples, *rows.shape[1:]), dtype=dtype, device=value.device)
    sums.index_add_(0, owner, rows.to(dtype))
    return sums / lengths.view(-1, *[1] * (rows.dim() - 1)).to(dtype)


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
