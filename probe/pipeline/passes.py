"""One batch through the model, as the runner computes it (``Pass``): a forward pass, and the
backward pass of a gradient run (``ForwardPass``, here), or a generation
(probe.pipeline.generation). Each owns its batch's rows (``capture.batch``: its layout, the
copies, the early stop) and gives back the batch as computed (``Computed``): every row to
store, how many each sample has, and when the copies from a GPU are done.

    computed = plan.compute(batch)
    writer.put(batch.index, batch.target, computed.rows, lengths=computed.lengths,
               ready=computed.ready, ...)
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import ProbeConfig
from probe.data.feed import Batch, ModelLimits
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.families.base import Family
from probe.file.format import DatasetSpec
from probe.pipeline.batch_rows import Computed
from probe.pipeline.generation import GenerationPass
from probe.pipeline.generation_decoded import DecodedGenerationPass
from probe.pipeline.hooks import Capture, StopForward
from probe.pipeline.objectives import Objective

__all__ = ["Pass", "ForwardPass", "pass_for"]


class Pass(Protocol):
    """How a run computes a batch (see the module's docstring)."""

    def __call__(self, batch: Batch) -> Computed:
        """Compute ``batch`` (on the device) with the capture's hooks on."""

    def rows(self, layout: RowLayout) -> RowLayout:
        """The layout of the rows stored for batches whose own layout is ``layout`` (what the
        plan checks the keys against, and whose bookkeeping the file holds)."""

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        """The datasets of one row per sample that the pass adds."""

    def positions(self, stored: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        """The most positions each sample can store, from the feed's count for its input
        (``stored``), and whether that is exact."""

    def limits(self, limits: ModelLimits) -> ModelLimits:
        """What a sample's input can hold, from what the model's can (``limits``)."""

    def rehearse(self, batch: Batch) -> None:
        """Compute the dry run's batch (on the device) as the run will, where that can fail in
        ways a forward pass does not show: before any file exists.

        Raises:
            ConfigError: what cannot work, in one line.
        """

    def summary(self) -> str | None:
        """What the pass did over the run, beyond computing its batches, for the run's last
        log line (interventions: where they applied); None: nothing to say."""


def pass_for(config: ProbeConfig, model_cfg: DictConfig, family: Family, model: nn.Module,
             capture: Capture | None, objective: Objective | None = None) -> Pass:
    """How each batch of the run that ``config`` describes is computed: a forward pass, or
    the model's generation (``generate.max_new_tokens``). Interventions wrap either
    (probe.pipeline.interventions.Intervened).

    Raises:
        ConfigError: generation asked of a model that does not generate text.
    """
    generate = config.generate
    if not generate.max_new_tokens:
        return ForwardPass(model, family, capture, objective)
    detokenize = family.detokenizer(model_cfg)
    if detokenize is None:
        raise ConfigError(f"generate.max_new_tokens={generate.max_new_tokens}: "
                          f"{type(model).__name__} does not generate text; use a language "
                          "model (model=transformers model.name=...), or leave generate out")
    # an encoder-decoder's answers are its decoder's rows (probe.pipeline.generation_decoded)
    generation = DecodedGenerationPass if family.decodes_answers(model) else GenerationPass
    return generation(model, family, capture, generate, detokenize, seed=config.seed)


@dataclass
class ForwardPass:
    """One forward pass per batch; for a gradient run, with the objective's backward pass."""

    model: nn.Module
    family: Family
    capture: Capture
    objective: Objective | None = None

    def __call__(self, batch: Batch) -> Computed:
        model, capture, family = self.model, self.capture, self.family
        layout = family.layout(model, batch)
        with capture.batch(layout) as rows:  # the hooks make rows as they capture
            if capture.needs_grad:
                # parameters are frozen: the graph starts at the hooked modules (or at the
                # input, where a kind counts every path from a module's input)
                from_input = any(kind.from_input for kind in capture.kinds)
                with torch.enable_grad():
                    output = family.forward(model, batch, input_grad=from_input)
                    capture.backward(self.objective(output, batch).sum())
            else:
                # StopForward: every hooked module has run, the rest of the model is not needed
                with torch.inference_mode(), suppress(StopForward):
                    family.forward(model, batch)
        stored = {**rows.take(order=capture.keys), **layout.bookkeeping_rows,
                  **batch.sample_rows}
        return Computed(stored, layout.bounded_lengths or None, rows.ready)

    def rows(self, layout: RowLayout) -> RowLayout:
        return layout

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return {}

    def positions(self, stored: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        return stored, True

    def limits(self, limits: ModelLimits) -> ModelLimits:
        return limits

    def rehearse(self, batch: Batch) -> None:
        pass  # the dry run is this pass's rehearsal

    def summary(self) -> str | None:
        return None
