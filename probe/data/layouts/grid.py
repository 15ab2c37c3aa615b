"""The layout of a vision transformer's tokens: ``PatchGrid(prefix, grid)``, a fixed run of
``prefix`` special positions (class, register tokens) then patches on a (rows, columns) grid,
every position real; ``tokens=patches`` lays the patches out as a (features, rows, columns)
map."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.config.schema import Reduce, Tokens
from probe.data.layouts.base import Axes, Rows, Stored, feature_pooling
from probe.errors import ConfigError

__all__ = ["PatchGrid"]


@dataclass(frozen=True)
class PatchGrid(Rows):
    """``prefix`` special positions, then patches on ``grid`` (rows, columns), row by row, as
    vision transformers lay them out; every position counts."""

    prefix: int
    grid: tuple[int, int]

    @property
    def length(self) -> int:
        return self.prefix + self.grid[0] * self.grid[1]

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
            return Stored((shape[1], *self.grid), ("sample", "feature", "height", "width"),
                          False)
        return Stored(axes.others(shape), ("sample", *axes.others(names)), False)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        axis = 1 + axes.position
        if pool is Tokens.all:
            return value
        if pool is Tokens.patches:  # (B, D, rows, columns), patches in row-major order
            return value[:, self.prefix:].unflatten(1, self.grid).movedim(-1, 1)
        if pool is Tokens.mean:
            return value.mean(axis, dtype=torch.promote_types(value.dtype, torch.float32))
        return value.select(axis, 0 if pool is Tokens.first else -1)

    def describe(self) -> str | None:
        rows, columns = self.grid
        return (f"token layout: {self.length} tokens = {self.prefix} class/register token(s) "
                f"+ {rows}x{columns} patches; tokens=patches stores (features, {rows}, "
                f"{columns})")
