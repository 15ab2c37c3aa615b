"""What every row layout answers (``RowLayout``), how a captured value's axes lie (``Axes``),
the names of stored axes, and the layout of one row per sample (``SAMPLE_ROWS``).

A value follows a layout when the axis that its capture kind runs along positions (``Axes``)
is the layout's positions in every dry batch; the layout then says which positions count,
how ``tokens=`` pools them, what one stored row is and how its axes are named. A value that
follows no layout is stored a row per sample, as captured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from probe.config.schema import Reduce, Tokens
from probe.file.format import OFFSETS, DatasetSpec, split_key

__all__ = ["RowLayout", "Axes", "POSITIONS_FIRST", "Stored", "SampleRows", "SAMPLE_ROWS",
           "feature_dims", "plain_dims", "feature_pooling"]


@dataclass(frozen=True)
class Axes:
    """How a captured value's axes lie after its batch axis, as its capture kind says
    (probe.pipeline.kinds).

    ``position`` is the axis that may run along the batch's positions (a module's output:
    the first; an attention pattern's: its queries); ``names`` names every axis, that one's
    included (None: a module's output or input, whose axes after the positions are its
    features). ``keys``: the last axis runs over the sample's positions too (an attention
    pattern's keys), so that a layout of ragged positions pads it to ``longest`` (the most
    positions a sample has, which the plan fills in) and a generation, which adds positions
    step by step, cannot store it. ``what`` names the values in messages; ``unreduced`` is
    the line that refuses a reduce of them (None: they can be reduced).
    """

    position: int = 0
    names: tuple[str, ...] | None = None
    keys: bool = False
    longest: int | None = None
    what: str = "value"
    unreduced: str | None = None

    def follows(self, length: int, shape: tuple[int, ...]) -> bool:
        """Whether a (B, ...) value of ``shape`` has ``length`` positions along its position
        axis, with an axis after it (a (B, L) value is not a row of features per position)."""
        axis = 1 + self.position
        return len(shape) > axis + 1 and shape[axis] == length

    def dims(self, axes: int, position: str) -> tuple[str, ...]:
        """The names of ``axes`` axes (after the batch axis), the position axis called
        ``position`` where the kind leaves it unnamed."""
        if self.names is not None:
            return self.names
        return (position, *feature_dims(axes - 1))

    def others(self, values: tuple) -> tuple:
        """``values`` (one per axis after the batch axis) without the position axis's."""
        return values[:self.position] + values[self.position + 1:]


# a module's output or input: positions (where it has them) first, then its features
POSITIONS_FIRST = Axes()


class Stored(NamedTuple):
    """What a layout stores of a key: one row's shape, the name of every stored axis (rows
    first), whether rows are one per position (else one per sample), and the attrs that say
    what the layout did to them (an axis padded)."""

    row_shape: tuple[int, ...]
    dims: tuple[str, ...]
    per_position: bool
    attrs: dict = {}


class RowLayout(Protocol):
    """What every layout answers (see the module's docstring)."""

    # (samples,) on the CPU: the rows each sample stores with tokens=all, where those are one
    # per position; None otherwise
    lengths: torch.Tensor | None

    @property
    def bounded_lengths(self) -> dict[str, torch.Tensor]:
        """The rows each sample stores per position, by the dataset that bounds them
        (/offsets; an encoder-decoder's decoder rows have their own); {} where rows are one
        per sample."""

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        """Whether ``key``'s captured (B, ...) value of ``shape`` runs along this layout's
        positions on its ``axes.position`` axis."""

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        """What is stored of a key that follows the layout, whose value has ``shape`` after
        its batch axis, pooled by ``pool`` (the config's ``tokens``) and then reduced.

        Raises:
            ConfigError: a pool, reduce or value that this layout's rows cannot take.
        """

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        """The stored rows (before the reduce) of a (B, ...) value of a key that follows the
        layout."""

    def check(self, plain: list[str], gradients: bool) -> None:
        """Refuse what this layout cannot store: keys that follow no layout (``plain``), or
        gradients.

        Raises:
            ConfigError: naming what to leave out.
        """

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        """The datasets of one row per kept position that go with the rows (token ids,
        positions, ...), filled from ``bookkeeping_rows``."""

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        """This batch's values of ``bookkeeping()``, one per kept position, on the CPU."""

    def describe(self) -> str | None:
        """The layout in words, for ``python -m probe.layers``; None where there is nothing
        to say."""

    def with_positions(self, make) -> RowLayout | None:
        """This layout with its positions along the model's input sequence (``Positions``)
        made anew by ``make(positions)`` (a generation's: the prompt's, then the answer's);
        None for a layout without such positions."""


def feature_dims(axes: int) -> tuple[str, ...]:
    """The names of the axes after a position axis: its features."""
    return ("feature",) if axes == 1 else tuple(f"feature{n}" for n in range(axes))


def plain_dims(axes: int) -> tuple[str, ...]:
    """The names of a per-sample row's axes (``axes`` after the batch axis), as PyTorch's
    layers lay them out: features, or channels then space."""
    if axes <= 1:
        return ("sample", "feature")[: axes + 1]
    spatial = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
    return ("sample", "channel", *spatial.get(axes - 1, tuple(f"axis{n}" for n in
                                                              range(2, axes + 1))))


def feature_pooling(key: str, reduce: Reduce, rows: str, instead: str) -> str:
    """The line that refuses a reduce of the axes after a position axis: they are features,
    not space."""
    return (f"reduce={reduce.name} on {key}, a token layout {rows}: it would {reduce.name}-pool "
            f"the feature axis; pool the tokens instead with {instead}, or leave this layer out "
            f"of the reduce ('reduce_by_layer={{{split_key(key)[0]}:none}}')")


class Rows:
    """What a layout does where it has nothing to add: no refusals, no bookkeeping, nothing
    to say, no positions of an input sequence."""

    lengths = None

    @property
    def bounded_lengths(self) -> dict[str, torch.Tensor]:
        return {} if self.lengths is None else {OFFSETS: self.lengths}

    def check(self, plain: list[str], gradients: bool) -> None:
        pass

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return {}

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return {}

    def describe(self) -> str | None:
        return None

    def with_positions(self, make) -> RowLayout | None:
        return None


@dataclass(frozen=True)
class SampleRows(Rows):
    """One row per sample: values with no position axis (conv maps, logits). Nothing follows
    it; what follows no layout is stored this way, as captured."""

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return False

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        raise AssertionError(f"{key}: nothing follows a layout of one row per sample")

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        return value


SAMPLE_ROWS = SampleRows()
