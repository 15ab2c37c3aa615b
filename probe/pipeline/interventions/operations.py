"""What each ``do:`` does, one class per operation, looked up by name (``OPERATIONS``): the keys
it takes, what it reads before the run (``resolve``: the module its hook goes on, a vector, a
mean, a patch file), what it reads per batch (``for_batch``), and the value it puts in place of
the module's (``new``: the whole tensor; the caller keeps the old one where the positions are
not chosen).

A new operation is a class here and its line in ``OPERATIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from probe.errors import ConfigError
from probe.families.base import Family
from probe.file.format import dataset_key
from probe.pipeline.interventions.positions import CallPositions
from probe.pipeline.interventions.sources import PatchSource, Row, mean_row, read_vector

__all__ = ["Change", "Call", "Operation", "OPERATIONS"]


@dataclass
class Change:
    """One intervention, resolved against the model."""

    at: str  # the module, as the user named it
    do: str
    positions: str | tuple[int, ...]
    where: str  # the intervention in words, for messages
    module: str = ""  # the module its hook goes on: ``at``, or for heads their projection
    said: dict = field(default_factory=dict)  # what the file records of it
    alpha: float = 1.0
    heads: tuple[int, ...] = ()
    head_count: int = 0
    row: Row | None = None  # a vector, or a mean
    patch: PatchSource | None = None
    generating: bool = False  # the run generates: a patch file's samples hold answer rows too

    @property
    def label(self) -> str:
        """The change in a few words, for the log."""
        heads = f" {list(self.heads)}" if self.heads else ""
        return f"{self.do}{heads} at {self.at}"


@dataclass(frozen=True)
class Call:
    """One application: the module's value in the current call, the positions chosen (None:
    all of it, a value without positions), the call's positions, and the batch's state."""

    value: torch.Tensor
    chosen: torch.Tensor | None
    positions: CallPositions
    batch: object  # what ``for_batch`` read, or None
    rehearsal: bool  # a dry run's batch, whose samples may be shortened copies


class Operation:
    """``do: <name>``: see the module's docstring."""

    needs: tuple[str, ...] = ()  # keys it requires, besides at, do and positions
    may: tuple[str, ...] = ()  # keys it takes if given
    on_input = False  # its hook changes the module's input (a pre-hook), not its output

    def resolve(self, change: Change, model: nn.Module, family: Family, source: str | None,
                vector: str | None, fingerprint: dict) -> None:
        """Fill ``change`` in: its module, and what it reads before the run.

        Raises:
            ConfigError: in one line naming ``change.where``.
        """
        change.module = change.at

    def for_batch(self, change: Change, index: np.ndarray):
        """What it reads for the batch of dataset indices ``index`` (None: nothing)."""
        return None

    def new(self, change: Change, call: Call) -> torch.Tensor:
        raise NotImplementedError


class Zero(Operation):
    def new(self, change: Change, call: Call) -> torch.Tensor:
        return torch.zeros_like(call.value)


class Scale(Operation):
    needs = ("alpha",)

    def new(self, change: Change, call: Call) -> torch.Tensor:
        return call.value * change.alpha


class Add(Operation):
    needs, may = ("vector",), ("alpha",)

    def resolve(self, change, model, family, source, vector, fingerprint) -> None:
        change.module, change.row = change.at, read_vector(change.where, vector)

    def new(self, change: Change, call: Call) -> torch.Tensor:
        return call.value + change.alpha * _fitted(change, call)


class Mean(Operation):
    needs = ("from",)

    def resolve(self, change, model, family, source, vector, fingerprint) -> None:
        change.module = change.at
        change.row = mean_row(change.where, source, dataset_key(change.at, "output"))

    def new(self, change: Change, call: Call) -> torch.Tensor:
        return _fitted(change, call).expand_as(call.value)


class Heads(Operation):
    """The listed heads' part of the input of the projection that joins them (the family
    says which projection, and how many heads), zeroed, or set to a file's mean of it."""

    needs, may = ("heads",), ("from",)
    on_input = True

    def resolve(self, change, model, family, source, vector, fingerprint) -> None:
        try:
            change.module, change.head_count = family.heads(model, change.at)
        except ConfigError as err:
            raise ConfigError(f"{change.where}: {err}") from None
        count = change.head_count
        beyond = [h for h in change.heads if h >= count]
        if beyond:
            raise ConfigError(f"{change.where}: head {beyond[0]} is beyond the {count} heads "
                              f"of {change.at!r} (0 to {count - 1})")
        change.said.update(heads=list(change.heads), projection=change.module)
        if source is not None:
            change.row = mean_row(change.where, source, dataset_key(change.module, "input"))

    def new(self, change: Change, call: Call) -> torch.Tensor:
        value, count, heads = call.value, change.head_count, list(change.heads)
        split = value.unflatten(-1, (count, value.shape[-1] // count)).clone()
        if change.row is None:
            split[..., heads, :] = 0
        else:
            split[..., heads, :] = _fitted(change, call).unflatten(-1, (count, -1))[heads]
        return split.flatten(-2)


class Patch(Operation):
    """The rows that a probe file stores for the same sample (by ``/index``) and position."""

    needs = ("from",)

    def resolve(self, change, model, family, source, vector, fingerprint) -> None:
        change.module = change.at
        change.patch = PatchSource(change.where, source, dataset_key(change.at, "output"),
                                   fingerprint)
        change.said.update(change.patch.said)

    def for_batch(self, change: Change, index: np.ndarray):
        return list(change.patch.rows(index))  # moved to the value's device when first used

    def new(self, change: Change, call: Call) -> torch.Tensor:
        value, rows, where = call.value, call.batch, change.where
        if rows[0].device != value.device or rows[0].dtype != value.dtype:
            rows[:] = rows[0].to(value.device, value.dtype), rows[1].to(value.device)
        rows, counts = rows
        if call.chosen is None:  # a row per sample
            if tuple(rows.shape) != tuple(value.shape):
                raise ConfigError(f"{where}: the stored rows are {tuple(rows.shape[1:])} but "
                                  f"the module's are {tuple(value.shape[1:])}; patch from a run "
                                  "of the same inputs")
            return rows
        if tuple(rows.shape[2:]) != tuple(value.shape[2:]):
            raise ConfigError(f"{where}: the stored rows are {tuple(rows.shape[2:])} wide but "
                              f"the module's are {tuple(value.shape[2:])}")
        positions = call.positions
        # a prompt's rows there are as many as its positions here (with generation, the
        # file's answer rows follow them; a dry run's shortened sample takes the first)
        at_least = change.generating or call.rehearsal
        differ = counts < positions.prompt if at_least else counts != positions.prompt
        if bool(differ.any()):
            b = int(differ.nonzero()[0, 0])
            held, here = int(counts[b]), int(positions.prompt[b])
            raise ConfigError(f"{where}: a sample has {held} rows in {change.patch.path!r} "
                              f"and {here} positions here; {_same_lengths(change, held > here)}")
        at = positions.current.clamp_min(0)
        beyond = call.chosen & (at >= counts[:, None])
        if bool(beyond.any()):
            b = int(beyond.any(1).nonzero()[0, 0])
            raise ConfigError(f"{where}: position {int(at[beyond][0])} of a sample has no row "
                              f"in {change.patch.path!r} (it holds {int(counts[b])}); patch "
                              "from a run of the same prompts and answers")
        at = at.clamp_max(rows.shape[1] - 1)
        return rows[torch.arange(len(rows), device=rows.device)[:, None], at]


def _same_lengths(change: Change, longer: bool) -> str:
    """The fix for a source sample whose rows are not as many as the prompt's positions."""
    if longer and change.patch.generated and not change.generating:
        # its rows are the prompt's and then the answer's: this run has the prompt's alone
        return ("the source run generated tokens, and stored their rows after the prompt's; "
                "patch from a run without generate.max_new_tokens, or with "
                "generate.rows=prompt")
    return "patch from a run of prompts of the same lengths"


def _fitted(change: Change, call: Call) -> torch.Tensor:
    """The change's row on the value's device and dtype, its shape checked against the rows
    of the value (after its batch axis, and its position axis where it has one)."""
    row, value = change.row.value, call.value
    rows = tuple(value.shape[1 if call.chosen is None else 2:])
    if change.do == "heads":
        rows = rows[-1:]
    if row.dim() > len(rows) or tuple(row.shape) != rows[len(rows) - row.dim():]:
        what = "vector" if change.do == "add" else "mean row"
        raise ConfigError(f"{change.where}: the {what} is {tuple(row.shape)} but the module's "
                          f"rows are {rows}; give one of that shape")
    return row.to(value.device, value.dtype)


OPERATIONS: dict[str, Operation] = {"zero": Zero(), "mean": Mean(), "heads": Heads(),
                                    "add": Add(), "scale": Scale(), "patch": Patch()}
