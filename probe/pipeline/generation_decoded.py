"""Generation by an encoder-decoder (T5, BART, Marian, Whisper, ...): its encoder reads each
prompt (a text, a clip) once, as fed, and its decoder answers a token a step
(``generate.max_new_tokens=K``), the hooks on through every step.

The encoder's rows are the prompt's (/offsets). The decoder's are the answer's, bounded by
/decoder_offsets: one per token of the decoder's sequence after its start token (tokens its
generation config puts first, as Whisper's language and task, then the new ones), up to and
with its end token, each the row of the step that predicted it, with the token that step read
in /decoder_input_ids. So a decoder row of a generated token is the row that a target of the
same tokens gives teacher-forced (``dataset.target_column``). Attention patterns and gradients
are refused as for a decoder-only generation; ``/completion`` holds each answer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from probe.data.feed import Batch, ModelLimits
from probe.data.layouts import Answered, Decoded, RowLayout
from probe.errors import ConfigError
from probe.families.base import Answers
from probe.file.format import DECODER_INPUT_IDS, DECODER_OFFSETS
from probe.pipeline.batch_rows import BatchRows
from probe.pipeline.generation import GenerationPass

__all__ = ["DecodedGenerationPass"]


class DecodedGenerationPass(GenerationPass):
    """Each batch's prompts answered by an encoder-decoder (see the module's docstring)."""

    def _answered_batch(self, batch: Batch, most: int | None = None
                        ) -> tuple[BatchRows, RowLayout, Answers, int]:
        settings = (self.settings if most is None else
                    replace(self.settings, max_new_tokens=most))
        with self._seeded(batch), torch.inference_mode(), self.capture.batch() as rows:
            answers = self.family.generate(self.model, batch.inputs, settings)
        layout = self._decoded(self.family.layout(self.model, batch))
        steps = answers.sequences.shape[1] - 1
        answered = (torch.arange(steps, device=answers.new.device)[None]
                    < answers.new[:, None]).cpu()
        read = answers.sequences[:, :steps].cpu()[answered].to(torch.int32)
        return rows, replace(layout, target=self._answers(answered, read), refusal=None), answers, 1

    def rows(self, layout: RowLayout) -> RowLayout:
        if self._decoded(layout).refusal is None:  # the data gave the decoder a target
            raise ConfigError("generate.max_new_tokens with a target for the decoder "
                              "(dataset.target_column): the decoder reads either its own answer "
                              "or the target; leave one out")
        empty = torch.zeros((0, 0), dtype=torch.bool)
        return replace(self._decoded(layout), refusal=None,
                       target=self._answers(empty, torch.zeros(0, dtype=torch.int32)))

    def positions(self, stored: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        return stored, stored is not None  # the prompt's rows: the answer's are the decoder's

    def limits(self, limits: ModelLimits) -> ModelLimits:
        return limits  # the answer takes none of the encoder's positions

    def _answers(self, keep: torch.Tensor, read: torch.Tensor) -> Answered:
        return Answered(keep, {DECODER_INPUT_IDS: read}, bounds=DECODER_OFFSETS,
                        most=self.settings.max_new_tokens)

    @staticmethod
    def _decoded(layout: RowLayout) -> Decoded:
        if not isinstance(layout, Decoded):
            raise ConfigError("generate.max_new_tokens on an encoder-decoder needs prompts: "
                              "dataset=text, read by its encoder")
        return layout
