"""Encoder-decoders of Hugging Face (T5, mT5, BART, Marian, Whisper, ...): how their decoder is
fed, and the layout of their rows.

A batch with a target (``labels``, padded with -100 as transformers pads them:
``dataset.target_column``, an audio dataset's ``transcript_column``) runs the decoder on it,
teacher-forced: its inputs are the target shifted right behind the start token, by the model's
own ``prepare_decoder_input_ids_from_labels`` (or its module's ``shift_tokens_right``). The
decoder's rows are then one per target token, in the layout ``Decoded`` with bounds of their
own (/decoder_offsets). A batch without one runs the encoder, and the decoder on its start
token alone (the model's forward needs decoder inputs; a run that hooks the encoder alone stops
before the decoder), whose layers are then refused in one line. Generating
(``generate.max_new_tokens``), the decoder's rows are the answer's (``generate_decoded``).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from probe.config.schema import GenerateConfig
from probe.data.feed import IGNORED_TARGET, Batch
from probe.data.layouts import Decoded, Positions, RowLayout
from probe.errors import ConfigError
from probe.families.base import Answers
from probe.families.hf_generation import generate_options, new_tokens
from probe.file.format import DECODER_INPUT_IDS, DECODER_OFFSETS

__all__ = ["is_encoder_decoder", "with_decoder_start", "decoder_input_ids", "start_token",
           "decoded_layout", "generate_decoded"]


def is_encoder_decoder(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def decoder_input_ids(model: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """The decoder's teacher-forced inputs for a target ``labels`` (B, T): the start token,
    then the target, shifted right by the model's own code."""
    config = model.config
    if getattr(config, "decoder_start_token_id", None) is None:
        # a config may leave it out, as T5's may: its generation starts from what its
        # generation config says, or its padding token, and so does its shift here
        config.decoder_start_token_id = start_token(model)
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if prepare is not None:
        return prepare(labels=labels)
    shift = sys.modules[type(model).__module__].shift_tokens_right  # Whisper's
    return shift(labels, config.pad_token_id, config.decoder_start_token_id)


def start_token(model: nn.Module) -> int:
    """The token an encoder-decoder's decoder starts from: its config's, else its generation
    config's, else its padding token (T5's)."""
    for config in (model.config, getattr(model, "generation_config", None)):
        start = getattr(config, "decoder_start_token_id", None)
        if start is not None:
            return int(start)
    return int(getattr(model.config, "pad_token_id", None) or 0)


def with_decoder_start(model: nn.Module, inputs: dict) -> dict:
    """``inputs`` as the model takes them: an encoder-decoder's target (``labels``) as the
    decoder's teacher-forced inputs and their mask, or, without one, its start token for
    each sample."""
    if not is_encoder_decoder(model) or "decoder_input_ids" in inputs:
        return inputs
    if "labels" in inputs:
        labels = inputs["labels"]
        given = {key: value for key, value in inputs.items() if key != "labels"}
        return {**given, "decoder_input_ids": decoder_input_ids(model, labels),
                "decoder_attention_mask": (labels != IGNORED_TARGET).long()}
    ids = inputs["input_ids"] if "input_ids" in inputs else next(iter(inputs.values()))
    return {**inputs, "decoder_input_ids": torch.full((len(ids), 1), start_token(model),
                                                     dtype=torch.long, device=ids.device)}


def generate_decoded(model: nn.Module, inputs: dict, settings: GenerateConfig) -> Answers:
    """An encoder-decoder's answers to its prompts (right-padded, as fed: an encoder of learned
    positions reads a left-padded prompt otherwise): its own ``generate()``, whose encoder runs
    once and whose decoder runs a step per new token. ``sequences`` are the decoder's: its
    start token, then the new ones; the decoder's rows are those of the steps, each of which
    read a token and predicted the next, so the last new token (never read) has none of its
    own: the row that predicted it is its row, as a teacher-forced target's is."""
    options, ends = generate_options(model, settings)
    given = {key: value for key, value in inputs.items() if key != "labels"}
    if getattr(model.generation_config, "decoder_start_token_id", None) is None:
        options["decoder_start_token_id"] = start_token(model)
    sequences = model.generate(**given, **options).sequences
    return Answers(sequences, new_tokens(sequences[:, 1:], ends))


def decoded_layout(model: nn.Module, batch: Batch, source: RowLayout) -> RowLayout:
    """The layout of an encoder-decoder's batch (``Decoded``): the encoder's values follow
    ``source`` (the feed's positions), the decoder's the target's tokens, or a line refuses
    them where the batch has no target. Any other model's: ``source``."""
    labels = batch.inputs.get("labels") if isinstance(batch.inputs, dict) else None
    if not is_encoder_decoder(model):
        if labels is not None:
            raise ConfigError(
                f"dataset.target_column gives {type(model).__name__} a target, which an "
                "encoder-decoder's decoder reads, and it has no decoder; leave target_column "
                "out (a prompt and its answer in one text are a decoder-only model's: "
                "dataset=chat, or generate.max_new_tokens)")
        return source
    if not isinstance(source, Positions):
        return source
    encoder = model.get_encoder()
    roots = tuple({*[name for name, module in model.named_modules() if module is encoder],
                   "encoder"})  # its path, and the standard names' prefix
    if labels is None:  # the decoder reads its start token alone
        keep = torch.ones((len(source.keep), 1), dtype=torch.bool)
        start = torch.full((len(keep),), start_token(model), dtype=torch.int32)
        target = Positions(keep, {DECODER_INPUT_IDS: start}, bounds=DECODER_OFFSETS)
        return Decoded(source, target, roots, _WITHOUT_TARGET.format(
            model=type(model).__name__, layer="{layer}"))
    keep = (labels != IGNORED_TARGET).cpu()
    read = decoder_input_ids(model, labels).cpu()
    target = Positions(keep, {DECODER_INPUT_IDS: read[keep].to(torch.int32)},
                       bounds=DECODER_OFFSETS)
    return Decoded(source, target, roots)


_WITHOUT_TARGET = (
    "{layer} is in the decoder of {model}, an encoder-decoder, and the data gives it no target "
    "to read: its rows are a target's tokens, teacher-forced; name the targets with "
    "dataset.target_column (dataset=text) or dataset.transcript_column (dataset=audio, whole "
    "clips), or hook the encoder's blocks")
