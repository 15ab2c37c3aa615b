"""Generation: a language model answers each prompt with its own ``generate()``, the hooks on
through every step (``generate.max_new_tokens=K``).

The prompts are padded on the left (the new tokens follow each one's last token), the model
generates with its key/value cache, and the capture joins what each step adds: the prompt's
positions, then one per new token. One more step feeds the last new token, so that it has its
row too (its next-token logits are dropped). No position is computed twice, and nothing is
run again after the answer.

A sample's rows are its prompt's tokens, then its new tokens up to and with its end token
(``generate.rows`` keeps one of the two); padding is never stored. ``/generated`` marks the
new tokens' rows, ``/completion`` holds each answer as text. Sampling (``generate.do_sample``)
is seeded batch by batch from ``seed`` and the batch's first sample, so a run that resumes
(at a group of batches made as before) draws what an uninterrupted one draws.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from probe.config.schema import GenerateConfig, GeneratedRows
from probe.data.feed import Batch, ModelLimits
from probe.data.layouts import Answered, Positions, RowLayout
from probe.errors import ConfigError
from probe.families.base import Answers, Family
from probe.file.format import (
    COMPLETION,
    DOCUMENT,
    GENERATED,
    INPUT_IDS,
    POSITIONS,
    Attr,
    DatasetSpec,
    split_key,
)
from probe.pipeline.batch_rows import BatchRows, Computed
from probe.pipeline.hooks import Capture

__all__ = ["GenerationPass"]

log = logging.getLogger(__name__)

_REHEARSED_TOKENS = 2  # new tokens of the plan's rehearsal: the prompt's step, and a later one


@dataclass
class GenerationPass:
    """Each batch's prompts answered (see the module's docstring); a ``Pass``."""

    model: nn.Module
    family: Family
    capture: Capture
    settings: GenerateConfig
    detokenize: Callable[[list[list[int]]], list[str]]
    seed: int = 0
    # the prompt's step computes every position's logits: set by ``rehearse`` where a hooked
    # module would otherwise see the last position alone (a language-model head)
    all_logits: bool = False

    def __call__(self, batch: Batch) -> Computed:
        rows, layout, answers, prompt = self._answered_batch(batch)
        new = answers.sequences[:, prompt:].tolist()
        texts = self.detokenize([row[:n] for row, n in zip(new, answers.new.tolist(),
                                                            strict=True)])
        # HDF5's strings end at a NUL, which a byte-level tokenizer can decode to: it is
        # stored as U+FFFD, as undecodable bytes are (the ids, in /input_ids, are exact)
        texts = [text.replace("\0", "\ufffd") for text in texts]
        stored = {**rows.take(layout, order=self.capture.keys), **layout.bookkeeping_rows,
                  **batch.sample_rows, COMPLETION: np.array(texts, dtype=object)}
        return Computed(stored, layout.bounded_lengths or None, rows.ready)

    def _answered_batch(self, batch: Batch, most: int | None = None
                        ) -> tuple[BatchRows, RowLayout, Answers, int]:
        """The batch's prompts answered (``most`` new tokens at most, where given), the hooks
        on through every step: the rows of the steps, to be joined; the layout of the whole
        sequences; the answers; the prompts' padded length. The prompts are the feed's
        positions (``rows`` refused a run without)."""
        ids = batch.inputs["input_ids"]
        inputs, keep = _padded_left(batch.inputs, batch.layout.keep.to(ids.device))
        mask = inputs["attention_mask"]
        settings = (self.settings if most is None else
                    replace(self.settings, max_new_tokens=most))
        with self._seeded(batch), torch.inference_mode(), self.capture.batch() as rows:
            try:
                answers = self.family.generate(self.model, inputs, settings,
                                               all_logits=self.all_logits)
            except ConfigError as err:  # said of the user's count, not the rehearsal's
                said = f"generate.max_new_tokens={settings.max_new_tokens}"
                real = f"generate.max_new_tokens={self.settings.max_new_tokens}"
                raise ConfigError(str(err).replace(said, real)) from None
        layout = self.family.layout(self.model, batch).with_positions(
            lambda prompts: self._answered(answers, mask, keep, prompts))
        return rows, layout, answers, ids.shape[1]

    def rehearse(self, batch: Batch) -> None:
        """Answer the dry run's sample (a few tokens) before any file exists: a model that
        cannot generate says so here, and a hooked module that sees fewer positions than the
        model is fed (a head that computes the last position's logits alone) has the prompt's
        step compute them all; a module that still does is refused.

        Raises:
            ConfigError: naming the model or the module.
        """
        with self.capture:
            for all_logits in (False, True):
                self.all_logits = all_logits
                rows, layout, answers, _ = self._answered_batch(batch, most=_REHEARSED_TOKENS)
                # the keys of the sequence's positions (a vision tower runs once, on the
                # prompt's images, and keeps its own rows)
                short = rows.mismatched(layout)
                if not short:
                    rows.take(layout)
                    log.info("generate: up to %d new tokens per prompt, %s; rows: %s%s",
                             self.settings.max_new_tokens, self._how(), self.settings.rows.name,
                             "; the prompt's step computes every position's logits (a hooked "
                             "module reads them)" if all_logits else "")
                    return
        key, seen = next(iter(short.items()))
        length = answers.sequences.shape[1]  # the prompt's positions, then the answer's
        raise ConfigError(
            f"{key} sees {seen} of the {length} positions that the model is fed while it "
            f"generates; leave {split_key(key)[0]!r} out of a generating run, or store it "
            "without generate.max_new_tokens")

    def rows(self, layout: RowLayout) -> RowLayout:
        def answered(prompts: Positions) -> Answered:
            if DOCUMENT in prompts.rows:
                raise ConfigError("generate.max_new_tokens answers whole prompts, and "
                                  "dataset.packing=true cuts documents into windows; set "
                                  "dataset.packing=false")
            flags = torch.zeros(0, dtype=torch.bool)
            return Answered(prompts.keep, {**prompts.rows, GENERATED: flags},
                            most=self.settings.max_new_tokens, rows_kept=self.settings.rows)

        stored = layout.with_positions(answered)
        if stored is None:
            raise ConfigError("generate.max_new_tokens needs prompts: dataset=text or "
                              "dataset=tokens, read by a language model, or dataset=pairs "
                              "read by a vision-language model")
        return stored

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return {COMPLETION: DatasetSpec((), "str", {Attr.DIMS: ["sample"]},
                                        compressible=False)}

    def positions(self, stored: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        if stored is None:
            return None, False
        most = self.settings.max_new_tokens
        return {GeneratedRows.all: (stored + most, False),
                GeneratedRows.prompt: (stored, True),
                GeneratedRows.answer: (np.full_like(stored, most), False)}[self.settings.rows]

    def limits(self, limits: ModelLimits) -> ModelLimits:
        """The positions a prompt can have: the model's, less the new tokens'."""
        if limits.positions is None:
            return limits
        most = self.settings.max_new_tokens
        if most >= limits.positions:
            raise ConfigError(f"generate.max_new_tokens={most} is beyond the "
                              f"{limits.positions} positions of {limits.model}; use fewer")
        return replace(limits, positions=limits.positions - most,
                       model=f"{limits.model} less generate.max_new_tokens={most}")

    def summary(self) -> str | None:
        return None

    def _how(self) -> str:
        settings = self.settings
        stop = "to the end token" if settings.stop_at_eos else "past end tokens"
        if not settings.do_sample:
            return f"the most likely each time, {stop}"
        shaped = ", ".join(f"{key}={getattr(settings, key)}" for key in ("temperature", "top_p")
                           if getattr(settings, key) is not None)
        return f"sampled ({shaped or 'as the checkpoint configures'}; seed={self.seed}), {stop}"

    @contextmanager
    def _seeded(self, batch: Batch):
        if not self.settings.do_sample:
            yield
            return
        device = batch.inputs["input_ids"].device
        cuda = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(self.seed * 1_000_003 + int(batch.index[0]))
            yield

    def _answered(self, answers: Answers, mask: torch.Tensor, keep: torch.Tensor,
                  prompts: Positions) -> Answered:
        """The rows of the joined sequence: each prompt's kept tokens, then its new tokens (as
        ``generate.rows`` keeps them); ``keep``: the prompts' kept positions, padded on the
        left as ``mask``, of the rows of ``prompts``."""
        sequences, new = answers.sequences, answers.new
        steps = sequences.shape[1] - mask.shape[1]
        answered = (torch.arange(steps, device=new.device)[None] < new[:, None])
        rows = self.settings.rows
        kept = torch.cat([keep & (rows is not GeneratedRows.answer),
                          answered & (rows is not GeneratedRows.prompt)], 1)
        real = torch.cat([mask.bool(), answered], 1)
        generated = torch.cat([torch.zeros_like(mask, dtype=torch.bool), answered], 1)
        positions = real.long().cumsum(1) - 1
        bookkeeping = {INPUT_IDS: sequences[kept].to(torch.int32).cpu(),
                       POSITIONS: positions[kept].to(torch.int32).cpu(),
                       GENERATED: generated[kept].cpu(),
                       **_carried(prompts, keep.cpu(), steps, kept.cpu())}
        return Answered(kept, bookkeeping, most=self.settings.max_new_tokens,
                        rows_kept=rows, lengths=kept.sum(1).cpu())


def _padded_left(inputs: dict, keep: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """Right-padded (B, L) prompts as left-padded ones (the new tokens follow each prompt's
    last token): each row of every (B, L) input (ids, mask, a processor's token types) and
    of ``keep`` turned by its padding."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    length = ids.shape[1]
    shift = length - mask.sum(1, keepdim=True)
    source = (torch.arange(length, device=ids.device)[None] - shift) % length
    turned = {key: value.gather(1, source)
              if isinstance(value, torch.Tensor) and value.shape == ids.shape else value
              for key, value in inputs.items()}
    return turned, keep.gather(1, source)


def _carried(prompts: Positions, keep: torch.Tensor, steps: int, kept: torch.Tensor
             ) -> dict[str, torch.Tensor]:
    """The feed's own bookkeeping of the prompts' rows (a vision-language model's /modality
    and /patch) on the rows kept of the joined sequence: a prompt row's own value, the
    layout's ``answer_fill`` on a generated one. ``keep``: the prompts' kept positions
    (padded on the left), whose rows ``prompts.rows`` holds in order."""
    carried = {}
    for name, fill in prompts.answer_fill.items():
        values = prompts.rows[name]
        joined = torch.full((len(keep), keep.shape[1] + steps, *values.shape[1:]), fill,
                            dtype=values.dtype)
        joined[:, :keep.shape[1]][keep] = values
        carried[name] = joined[kept]
    return carried
