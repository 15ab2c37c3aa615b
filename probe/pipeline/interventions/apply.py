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
from functools import partial

import torch
from torch import nn

from probe.data.feed import Batch
from probe.errors import ConfigError
from probe.families.base import Family, first_tensor
from probe.pipeline.interventions.config import Intervention
from probe.pipeline.interventions.operations import OPERATIONS, Call, Change, Operation
from probe.pipeline.interventions.positions import CallPositions
from probe.pipeline.kinds import hooked

__all__ = ["Interventions"]


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
        self.changes: list[Change] = []
        self._modules = modules = dict(model.named_modules())
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
                self.changes.append(_resolved(where, item, model, family, generating,
                                              model_fingerprint))
        except BaseException:
            self.close()
            raise

    def __bool__(self) -> bool:
        return bool(self.changes)

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
        return [change.where + ("" if change.module == change.at else
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
        modules = self._modules
        handles = [self.model.register_forward_pre_hook(positions.read, with_kwargs=True)]
        # prepended in reverse: the interventions run first, in the order given
        for n in reversed(range(len(self.changes))):
            change = self.changes[n]
            operation = OPERATIONS[change.do]
            apply = partial(_apply, change, operation, operation.for_batch(change, batch.index),
                            positions, rehearsal, applied, n)
            module = modules[change.module]
            if operation.on_input:
                handles.append(module.register_forward_pre_hook(
                    partial(_on_input, change.where, apply), with_kwargs=True, prepend=True))
            else:
                handles.append(module.register_forward_hook(
                    partial(_on_output, change.where, apply), prepend=True))
        with hooked(handles):
            yield applied

    def close(self) -> None:
        """Close the files that patches read."""
        for change in self.changes:
            if change.patch is not None:
                change.patch.close()



def _resolved(where: str, item: Intervention, model: nn.Module, family: Family,
              generating: bool, fingerprint: dict) -> Change:
    change = Change(at=item.at, do=item.do, positions=item.positions, where=where,
                    alpha=item.alpha, heads=item.heads, generating=generating,
                    said={"at": item.at, "do": item.do,
                          "positions": item.positions if isinstance(item.positions, str)
                          else list(item.positions)})
    OPERATIONS[item.do].resolve(change, model, family, item.source, item.vector, fingerprint)
    if item.do in ("add", "scale"):
        change.said["alpha"] = item.alpha
    if change.row is not None:
        change.said.update(change.row.said)
    return change


def _apply(change: Change, operation: Operation, batch, positions: CallPositions,
           rehearsal: bool, applied: list[int], n: int, value: torch.Tensor) -> torch.Tensor:
    """``value`` as the intervention changes it in this call; its applications counted."""
    chosen = positions.select(change.positions, value, change.where)
    new = operation.new(change, Call(value, chosen, positions, batch, rehearsal))
    if chosen is None:  # a value without positions: changed whole
        applied[n] += len(value)
        return new
    applied[n] += int(chosen.sum())
    return torch.where(chosen.view(*chosen.shape, *[1] * (value.dim() - 2)), new, value)


def _on_output(where: str, apply, module: nn.Module, args, output):
    value, slot = first_tensor(output)
    if value is None:
        raise ConfigError(f"{where}: {type(module).__name__} gives no tensor to change; "
                          "intervene at a module that outputs one")
    new = apply(value)
    if slot is None:
        return new
    return type(output)((*output[:slot], new, *output[slot + 1:]))


def _on_input(where: str, apply, module: nn.Module, args: tuple, kwargs: dict):
    value, slot = first_tensor(args)
    if value is None:
        raise ConfigError(f"{where}: {type(module).__name__} is given no tensor by position "
                          "to change; intervene at a module that is")
    return (*args[:slot], apply(value), *args[slot + 1:]), kwargs
