"""Objectives: the scalar per sample that backward hooks differentiate.

An objective maps the model's output (N, classes) and the batch's targets (N,) to one value per
sample (N,). The runner sums it over the batch, so each row's gradient is that sample's own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omegaconf import DictConfig

from probe.errors import ConfigError

__all__ = ["top1", "target", "make_objective", "per_sample"]

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def top1(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logit of each sample's predicted class."""
    return output.gather(1, output.argmax(1, keepdim=True)).squeeze(1)


def target(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logit of each sample's target class (the dataset's label)."""
    return output.gather(1, targets.to(output.device).view(-1, 1)).squeeze(1)


def make_objective(spec) -> tuple[Objective, str]:
    """The objective that the config's ``objective`` names, and how to record it.

    Raises:
        ConfigError: an unknown name or a ``_target_`` that cannot be loaded.
    """
    if isinstance(spec, (dict, DictConfig)) and "_target_" in spec:
        from hydra.errors import InstantiationException
        from hydra.utils import instantiate

        try:
            return instantiate(spec, _partial_=True), str(spec["_target_"])
        except InstantiationException as err:
            raise ConfigError(f"objective: {err}") from None
    named = {"top1": top1, "target": target}
    if str(spec) == "nll":
        raise ConfigError("objective=nll is a language model's next-token loss; this model gives "
                          "class logits: use objective=top1 or target (nll needs "
                          "model=transformers with dataset=text)")
    if str(spec) not in named:
        raise ConfigError(
            f"objective={spec!r} is unknown; use top1, target, or a config with a _target_ "
            "callable (output, targets) -> one value per sample"
        )
    return named[str(spec)], str(spec)


def per_sample(objective: Objective, output, targets: torch.Tensor) -> torch.Tensor:
    """Apply ``objective`` and check that it gave one value per sample.

    Raises:
        ConfigError: the objective's result does not have shape (N,).
    """
    from probe.layers import first_tensor

    logits, _ = first_tensor(output)
    if logits is None or logits.dim() != 2:
        shape = None if logits is None else tuple(logits.shape)
        raise ConfigError(
            f"the objective needs the model's output as (batch, classes) logits, got {shape}; "
            "use a classification model or an objective _target_ that reads this output"
        )
    values = objective(logits, targets)
    n = logits.shape[0]
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != (n,):
        got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ConfigError(
            f"the objective returned {got} for a batch of {n}; it must return one value per "
            f"sample, shape ({n},)"
        )
    return values
