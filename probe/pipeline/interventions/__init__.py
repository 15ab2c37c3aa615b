"""Interventions while capturing: the model run under a change (ablated, patched, steered), as a
recorded condition. ``+intervene=<name>`` picks conf/intervene/<name>.yaml (or a --config-dir's):
a list of ``{at, do, ...}`` items (probe.pipeline.interventions.config). The run resolves them
against its model (``interventions_for``), computes each batch with their hooks on
(``Intervened``, a pass around the run's own), and records them in the file's attrs and
fingerprint.

    config     the group's items, read and checked        (Intervention, read_interventions)
    positions  which positions of a call are changed      (CallPositions)
    sources    vectors, means and patched rows from files (read_vector, mean_row, PatchSource)
    apply      the hooks                                  (Interventions)
    intervened the pass                                   (Intervened)
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from torch import nn

from probe.families.base import Family
from probe.pipeline.interventions.apply import Interventions
from probe.pipeline.interventions.config import Intervention, read_interventions
from probe.pipeline.interventions.intervened import Intervened

__all__ = ["Intervention", "Interventions", "Intervened", "interventions_for",
           "read_interventions"]


def interventions_for(cfg: DictConfig, model: nn.Module, family: Family, *, generating: bool,
                      model_fingerprint: dict) -> Interventions:
    """The interventions that ``cfg``'s ``intervene`` group names (none where it is not
    chosen), resolved against ``model``.

    Raises:
        ConfigError: an item that cannot work, in one line.
    """
    value = cfg.get("intervene")
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    return Interventions(read_interventions(value), model, family, generating=generating,
                         model_fingerprint=model_fingerprint)
