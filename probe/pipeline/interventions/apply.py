"""The interventions of a run, resolved against its model, and their hooks: each a forward hook
that returns the module's changed output (``heads``: a pre-hook that changes the input of the
projection joining the heads), on for one batch at a time.

Every hook is put ahead of the module's other hooks, in the order the interventions are given,
so a capture of the same module stores the changed value (its output, or for ``heads`` the
projection's input); a module upstream of an intervention is stored unchanged, one downstream
as the changed model computed it. A change is computed out of place (``torch.where``), so
gradients flow through it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from probe.data.feed import Batch
from probe.errors import ConfigError
from probe.families.base import Family, first_tensor
from probe.file.format import dataset_key
from probe.pipeline.interventions.config import Intervention
from probe.pipeline.interventions.positions import CallPositions
from probe.pipeline.interventions.sources import PatchSource, Row, mean_row, read_vector
from probe.pipeline.kinds import hooked

__all__ = ["Interventions"]


@dataclass
class _Change:
    """One intervention, resolved: the module its hook goes on, and what it applies."""

    item: Intervention
    where: str  # the intervention, for messages
    module: str  # the hooked module: ``at``, or for heads the projection joining them
    said: dict  # what the file records of it
    row: Row | None = None  # the vector, or the mean
    patch: PatchSource | None = None
    head_count: int = 0
    generating: bool = False  # the run generates: a patch file's samples hold answer rows too

    @property
    def on_input(self) -> bool:
        return self.item.do == "heads"


class Interventions:
    """The interventions of a run (probe.pipeline.interventions.config), resolved against
    ``model``: modules found, heads located by the model's ``family``, vectors and means read,
    patch files opened and checked against the model's fingerprint. Empty: no hooks at all.

    Raises (on construction):
        ConfigError: a module the model does not have, heads beyond its count, positions=answer
            without generation, a source file that cannot serve, in one line.
    """

    def __init__(self, items: list[Intervention], model: nn.Module, family: Family, *,
                 generating: bool, model_fingerprint: dict):
        self.model = model
        self.changes: list[_Change] = []
        modules = dict(model.named_modules())
        try:
            for n, item in enumerate(items):
                where = f"intervene[{n}] ({item.label})"
                if item.at not in modules:
                    raise ConfigError(f"{where}: {type(model).__name__} has no module "
                                      f"{item.at!r}; python -m probe.layers lists them")
                if item.positions == "answer" and not generating:
                    raise ConfigError(f"{where}: positions=answer changes generated tokens, and "
                                      "this run generates none; set generate.max_new_tokens, "
                                      "or use positions=all|prompt|last")
                change = self._resolve(where, item, model, family, model_fingerprint)
                change.generating = generating
                self.changes.append(change)
        except BaseException:
            self.close()
            raise

    def __bool__(self) -> bool:
        return bool(self.changes)

    @staticmethod
    def _resolve(where: str, item: Intervention, model: nn.Module, family: Family,
                 fingerprint: dict) -> _Change:
        said = {"at": item.at, "do": item.do,
                "positions": item.positions if isinstance(item.positions, str)
                else list(item.positions)}
        module, count, row, patch = item.at, 0, None, None
        if item.do == "heads":
            try:
                module, count = family.heads(model, item.at)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
            beyond = [h for h in item.heads if h >= count]
            if beyond:
                raise ConfigError(f"{where}: head {beyond[0]} is beyond the {count} heads of "
                                  f"{item.at!r} (0 to {count - 1})")
            said.update(heads=list(item.heads), projection=module)
            if item.source is not None:
                row = mean_row(where, item.source, dataset_key(module, "input"))
        elif item.do == "mean":
            row = mean_row(where, item.source, dataset_key(item.at, "output"))
        elif item.do == "add":
            row = read_vector(where, item.vector)
        elif item.do == "patch":
            patch = PatchSource(where, item.source, dataset_key(item.at, "output"), fingerprint)
            said.update(patch.said)
        if item.do in ("add", "scale"):
            said["alpha"] = item.alpha
        if row is not None:
            said.update(row.said)
        return _Change(item, where, module, said, row, patch, count)

    def record(self) -> list[dict]:
        """What the file records of each intervention: its keys as resolved, the vector's or
        mean's digest, the source file's identity."""
        return [change.said for change in self.changes]

    def fingerprint(self) -> dict:
        """A digest of the record: a run of other interventions, or of the same ones with
        another vector or source file, never resumes into this run's file."""
        text = json.dumps(self.record(), sort_keys=True)
        return {"interventions": hashlib.sha256(text.encode()).hexdigest()[:16]}

    def touched(self) -> list[str]:
        """Each intervention in words, with the module its hook is on."""
        return [change.where + ("" if change.module == change.item.at else
                                f": the input of {change.module}") for change in self.changes]

    def rehearsing(self, batch: Batch) -> AbstractContextManager[list[int]]:
        """``on`` for a dry run's batch, whose samples may be shortened copies of a real one
        (a patch then takes the first of that sample's rows)."""
        return self.on(batch, rehearsal=True)

    @contextmanager
    def on(self, batch: Batch, *, rehearsal: bool = False) -> Iterator[list[int]]:
        """For the block, the interventions change the model's computation of ``batch``;
        yields each one's count of applications (positions changed, or samples for values
        without positions), which grows as the block runs. Every hook is removed after it."""
        applied = [0] * len(self.changes)
        if not self.changes:
            yield applied
            return
        positions = CallPositions()
        patches = {n: change.patch.rows(batch.index) for n, change in enumerate(self.changes)
                   if change.patch is not None}
        modules = dict(self.model.named_modules())
        handles = [self.model.register_forward_pre_hook(positions.read, with_kwargs=True)]
        # prepended in reverse: the interventions run first, in the order given
        for n in reversed(range(len(self.changes))):
            change = self.changes[n]
            apply = partial(self._apply, change, n, positions, patches, applied, rehearsal)
            module = modules[change.module]
            if change.on_input:
                handles.append(module.register_forward_pre_hook(
                    partial(_on_input, apply), with_kwargs=True, prepend=True))
            else:
                handles.append(module.register_forward_hook(partial(_on_output, apply),
                                                            prepend=True))
        with hooked(handles):
            yield applied

    def close(self) -> None:
        """Close the files that patches read."""
        for change in self.changes:
            if change.patch is not None:
                change.patch.close()

    def _apply(self, change: _Change, n: int, positions: CallPositions, patches: dict,
               applied: list[int], rehearsal: bool, value: torch.Tensor) -> torch.Tensor:
        """``value`` as the intervention changes it in this call."""
        item, where = change.item, change.where
        chosen = positions.select(item.positions, value, where)
        lies = chosen is not None  # the value has a position axis after the batch's
        if item.do == "zero":
            new = torch.zeros_like(value)
        elif item.do == "scale":
            new = value * item.alpha
        elif item.do in ("add", "mean"):
            row = _fitted(change, value, lies)
            new = value + item.alpha * row if item.do == "add" else row.expand_as(value)
        elif item.do == "heads":
            new = _heads_changed(change, value)
        else:
            new = _patched(change, value, patches, n, positions, chosen, rehearsal)
        if chosen is None:
            applied[n] += len(value)
            return new
        applied[n] += int(chosen.sum())
        return torch.where(chosen.view(*chosen.shape, *[1] * (value.dim() - 2)), new, value)


def _on_output(apply, module: nn.Module, args, output):
    value, slot = first_tensor(output)
    if value is None:
        raise ConfigError(f"{type(module).__name__} gives no tensor to change")
    new = apply(value)
    if slot is None:
        return new
    return type(output)((*output[:slot], new, *output[slot + 1:]))


def _on_input(apply, module: nn.Module, args: tuple, kwargs: dict):
    value, slot = first_tensor(args)
    if value is None:
        raise ConfigError(f"{type(module).__name__} is given no tensor to change")
    return (*args[:slot], apply(value), *args[slot + 1:]), kwargs


def _fitted(change: _Change, value: torch.Tensor, lies: bool) -> torch.Tensor:
    """The change's row on ``value``'s device and dtype, its shape checked against the rows of
    ``value`` (after its batch and position axes)."""
    row = change.row.value
    rows = tuple(value.shape[2 if lies else 1:])
    if tuple(row.shape) != rows[len(rows) - row.dim():] or row.dim() > len(rows):
        what = "vector" if change.item.do == "add" else "mean row"
        raise ConfigError(f"{change.where}: the {what} is {tuple(row.shape)} but the module's "
                          f"rows are {rows}; give one of that shape")
    return row.to(value.device, value.dtype)


def _heads_changed(change: _Change, value: torch.Tensor) -> torch.Tensor:
    """The projection's input with the listed heads' slices zeroed, or set to the mean's."""
    count, heads = change.head_count, list(change.item.heads)
    split = value.unflatten(-1, (count, value.shape[-1] // count)).clone()
    if change.row is None:
        split[..., heads, :] = 0
    else:
        mean = _fitted(change, value, True).unflatten(-1, (count, -1))
        split[..., heads, :] = mean[heads]
    return split.flatten(-2)


def _patched(change: _Change, value: torch.Tensor, patches: dict, n: int,
             positions: CallPositions, chosen: torch.Tensor | None, rehearsal: bool
             ) -> torch.Tensor:
    """The source file's rows at the call's positions (the value elsewhere)."""
    rows, counts = patches[n]
    if rows.device != value.device or rows.dtype != value.dtype:
        rows, counts = patches[n] = rows.to(value.device, value.dtype), counts.to(value.device)
    where = change.where
    if chosen is None:  # a row per sample
        if tuple(rows.shape) != tuple(value.shape):
            raise ConfigError(f"{where}: the stored rows are {tuple(rows.shape[1:])} but the "
                              f"module's are {tuple(value.shape[1:])}; patch from a run of the "
                              "same inputs")
        return rows
    if tuple(rows.shape[2:]) != tuple(value.shape[2:]):
        raise ConfigError(f"{where}: the stored rows are {tuple(rows.shape[2:])} wide but the "
                          f"module's are {tuple(value.shape[2:])}")
    # a prompt's rows there are as many as its positions here (with generation, the file's
    # answer rows follow them)
    at_least = change.generating or rehearsal
    differ = counts < positions.prompt if at_least else counts != positions.prompt
    if bool(differ.any()):
        b = int(differ.nonzero()[0, 0])
        raise ConfigError(f"{where}: a sample has {int(counts[b])} rows in "
                          f"{change.patch.path!r} and {int(positions.prompt[b])} positions "
                          "here; patch from a run of prompts of the same lengths")
    at = positions.current.clamp_min(0)
    beyond = chosen & (at >= counts[:, None])
    if bool(beyond.any()):
        b = int(beyond.any(1).nonzero()[0, 0])
        raise ConfigError(f"{where}: position {int(at[beyond][0])} of a sample has no row in "
                          f"{change.patch.path!r} (it holds {int(counts[b])}); patch from a "
                          "run of the same prompts and answers")
    at = at.clamp_max(rows.shape[1] - 1)
    return rows[torch.arange(len(rows), device=rows.device)[:, None], at]
