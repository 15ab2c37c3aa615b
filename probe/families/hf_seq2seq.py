"""Encoder-decoders of Hugging Face (T5, BART, Marian, ...) read as language models: fed a
text, they run their encoder on it, and their decoder on its start token alone (the model's
forward needs decoder inputs; a run that hooks the encoder stops before the decoder).

Their decoder's rows (a target's tokens, teacher-forced) and generation are not stored yet:
hooking the decoder, or generating, is one line, not a row of the start token that passes for
the text's or a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from probe.errors import ConfigError

__all__ = ["is_encoder_decoder", "with_decoder_start", "refuse_decoder_layers",
           "refuse_generation"]


def is_encoder_decoder(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def with_decoder_start(model: nn.Module, inputs: dict) -> dict:
    """``inputs`` with the decoder's start token for each sample, where the model has a
    decoder and nothing feeds it."""
    if not is_encoder_decoder(model) or "decoder_input_ids" in inputs:
        return inputs
    ids = inputs["input_ids"] if "input_ids" in inputs else next(iter(inputs.values()))
    # a config may leave the start token out (T5's falls back on its padding token)
    start = getattr(model.config, "decoder_start_token_id", None)
    start = getattr(model.config, "pad_token_id", None) if start is None else start
    return {**inputs, "decoder_input_ids": torch.full((len(ids), 1), int(start or 0),
                                                     dtype=torch.long, device=ids.device)}


def refuse_decoder_layers(model: nn.Module, layers: Iterable[str]) -> None:
    """Refuse hooked layers inside the decoder of an encoder-decoder.

    Raises:
        ConfigError: naming the first such layer and the encoder's blocks to hook instead.
    """
    if not is_encoder_decoder(model) or not hasattr(model, "get_decoder"):
        return
    decoder = model.get_decoder()
    inside = {name for name, module in model.named_modules()
              if module is decoder or any(module is m for m in decoder.modules())}
    hooked = [layer for layer in layers if layer in inside]
    if hooked:
        raise ConfigError(
            f"{hooked[0]} is in the decoder of {type(model).__name__}, an encoder-decoder: fed a "
            "text, it runs its encoder, and its decoder on the start token alone (a decoder's "
            "rows of a target text are not stored yet); hook the encoder's blocks")


def refuse_generation(model: nn.Module) -> None:
    """Refuse generation on an encoder-decoder, whose answer is the decoder's.

    Raises:
        ConfigError: one line.
    """
    if is_encoder_decoder(model):
        raise ConfigError(
            f"generate.max_new_tokens on {type(model).__name__}, an encoder-decoder: its answer "
            "is its decoder's, whose rows are not stored yet; leave generate out to store the "
            "encoder's rows of the text")
