"""Objectives: the scalar per sample that backward hooks differentiate.

An objective maps the model's output and the batch to one value per sample (N,); the runner sums
it over the batch, so each row's gradient is that sample's own. The named ones come from the
model's family (``Family.objective``): every classifier has ``top1`` (the logit of each
sample's predicted class) and ``target`` (that of its label, probe.families.base), language
models add ``nll``, two-tower models give ``similarity``. ``{_target_: mylab.objectives.margin}``
names a callable of your own, given the logits (as the family reads them from the output) and
the targets (N,).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig

from probe.errors import ConfigError

__all__ = ["Objective", "make_objective"]

Objective = Callable[[object, object], torch.Tensor]  # (model output, batch) -> (N,) values


def make_objective(spec, family, model) -> tuple[Objective, str]:
    """The objective that the config's ``objective`` names, and how to record it.

    Raises:
        ConfigError: a name the model's family does not give, or a ``_target_`` that cannot be
            loaded.
    """
    if isinstance(spec, (dict, DictConfig)) and "_target_" in spec:
        from hydra.errors import InstantiationException
        from hydra.utils import instantiate

        try:
            function = instantiate(spec, _partial_=True)
        except InstantiationException as err:
            raise ConfigError(f"objective: {err}") from None
        return _checked(lambda output, batch: function(family.logits(output), batch.target)), \
            str(spec["_target_"])
    return _checked(family.objective(str(spec), model)), str(spec)


def _checked(objective: Objective) -> Objective:
    def checked(output, batch) -> torch.Tensor:
        values = objective(output, batch)
        n = len(batch)
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (n,):
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise ConfigError(f"the objective returned {got} for a batch of {n}; it must return "
                              f"one value per sample, shape ({n},)")
        return values
    return checked
