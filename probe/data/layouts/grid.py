"""The layout of a vision transformer's tokens: ``PatchGrid(prefix, grid)``, a fixed run of
``prefix`` special positions (class, register tokens) then patches on a (rows, columns) grid,
every position real; ``tokens=patches`` lays the patches out as a (features, rows, columns)
map. A video transformer's patches are tubelets on a (time, rows, columns) grid, which models
lay out time first (VideoMAE, ViViT, V-JEPA 2) or last (TimeSformer: ``axes``);
``tokens=patches`` stores them as (features, time, rows, columns) either way."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from probe.config.schema import Reduce, Tokens
from probe.data.layouts.base import Axes, Rows, Stored, feature_pooling
from probe.errors import ConfigError

__all__ = ["PatchGrid"]

_ORDER = ("time", "height", "width")  # how a grid's axes are stored


@dataclass(frozen=True)
class PatchGrid(Rows):
    """``prefix`` special positions, then patches on ``grid``, whose axes are ``axes`` in the
    order the tokens run (the last fastest): (rows, columns), row by row, as vision
    transformers lay them out, or a video's three axes; every position counts."""

    prefix: int
    grid: tuple[int, ...]
    axes: tuple[str, ...] = ("height", "width")

    @property
    def length(self) -> int:
        return self.prefix + math.prod(self.grid)

    @property
    def _stored_order(self) -> tuple[int, ...]:
        # the grid's axes as stored: time, then height, then width
        return tuple(sorted(range(len(self.axes)), key=lambda a: _ORDER.index(self.axes[a])))

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return axes.follows(self.length, shape)

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        names = axes.dims(len(shape), "token")
        if pool is Tokens.all:  # a sample's every position, as computed
            if reduce in (Reduce.mean, Reduce.max):
                raise ConfigError(feature_pooling(
                    key, reduce, "(N, tokens, features)", "tokens=first (the class token), "
                    "last or mean, or tokens=patches to pool the patch grid"))
            return Stored(shape, ("sample", *names), False)
        if pool is Tokens.patches:
            if axes.position or len(shape) != 2:
                raise ConfigError(f"tokens=patches on {key}, whose rows are {shape}: patches "
                                  "need (tokens, features) rows; use tokens=all, first, last "
                                  "or mean")
            order = self._stored_order
            return Stored((shape[1], *(self.grid[a] for a in order)),
                          ("sample", "feature", *(self.axes[a] for a in order)), False)
        return Stored(axes.others(shape), ("sample", *axes.others(names)), False)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        axis = 1 + axes.position
        if pool is Tokens.all:
            return value
        if pool is Tokens.patches:  # (B, D, *grid), its axes in the stored order
            patches = value[:, self.prefix:].unflatten(1, self.grid).movedim(-1, 1)
            return patches.permute(0, 1, *(2 + a for a in self._stored_order))
        if pool is Tokens.mean:
            return value.mean(axis, dtype=torch.promote_types(value.dtype, torch.float32))
        return value.select(axis, 0 if pool is Tokens.first else -1)

    def describe(self) -> str | None:
        order = self._stored_order
        grid = "x".join(str(n) for n in self.grid)
        stored = ", ".join(str(self.grid[a]) for a in order)
        what = "patches" if len(self.grid) == 2 else (
            f"tubelets ({', '.join(self.axes)}, the last fastest)")
        return (f"token layout: {self.length} tokens = {self.prefix} class/register token(s) "
                f"+ {grid} {what}; tokens=patches stores (features, {stored})")
