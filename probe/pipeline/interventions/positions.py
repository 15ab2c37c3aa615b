"""Which positions of a forward call an intervention changes. The model's own call says it: a
pre-hook on the model reads the attention mask it is given and the length of the call's tokens,
so the same rule serves a padded batch (right-padded prompts), generation's first step (the
prompts padded on the left) and each later step (one new token, the cache holding the rest):

    position of token t of sample b = (real tokens of b up to t) - 1, or -1 for padding
    prompt positions of b           = b's real tokens in the batch's first call

``positions`` then read: ``all`` (every real position), ``prompt``, ``answer`` (a generated
token's), ``last`` (the prompt's last), or a sample's own positions (negative ones count back
from the prompt's end).
"""

from __future__ import annotations

import torch
from torch import nn

from probe.errors import ConfigError

__all__ = ["CallPositions"]


class CallPositions:
    """The positions of the model's current call, for one batch (see the module's docstring)."""

    def __init__(self) -> None:
        self.current: torch.Tensor | None = None  # (B, T): each token's position, -1 padding
        self.prompt: torch.Tensor | None = None  # (B,): each prompt's real tokens
        self.two_sequences = False  # an encoder-decoder's call: a text and a target or answer

    def read(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A forward pre-hook (with kwargs) on the model: note the call's positions."""
        # an encoder-decoder's modules run on one of two sequences, whose positions the call's
        # one mask does not tell apart (a decoder's value of as many positions as the text
        # would take the text's): only all of a value is changed there
        self.two_sequences = any(kwargs.get(name) is not None for name in _DECODER_INPUTS)
        self.current = None if self.two_sequences else _positions(args, kwargs)
        if self.prompt is None and self.current is not None:
            self.prompt = self.current.max(1).values + 1

    def select(self, positions, value: torch.Tensor, where: str) -> torch.Tensor | None:
        """Where ``value`` (a module's tensor in the current call) is changed: a boolean
        (B, T) over its first two axes, or None for all of it (a value without a position
        axis, changed whole).

        Raises:
            ConfigError: positions other than ``all`` on a value without a position axis (or
                of the call's last position alone), or beyond a sample's prompt.
        """
        current = self.current
        lies = (current is not None and value.dim() >= 3
                and tuple(value.shape[:2]) == tuple(current.shape))
        if not lies:
            if positions == "all":
                return None
            if self.two_sequences:
                raise ConfigError(
                    f"{where}: positions={_said(positions)} in an encoder-decoder, whose calls "
                    "hold two sequences (the encoder's text, the decoder's target or answer); "
                    "use positions=all")
            if _last_alone(value, current):
                raise ConfigError(
                    f"{where}: positions={_said(positions)} at a module that computes only the "
                    f"last position of the call (its value is {tuple(value.shape)} for "
                    f"{current.shape[1]} positions: a language model's head while generating, "
                    "logits_to_keep); use positions=all (each position it computes), or a "
                    "module before it")
            raise ConfigError(
                f"{where}: positions={_said(positions)} needs token positions, and this "
                f"module's value, {tuple(value.shape)}, does not lie (batch, position, ...) "
                "in a language model's call; use positions=all, or a module of the token "
                "sequence")
        prompt = self.prompt[:, None]
        if positions == "all":
            return current >= 0
        if positions == "prompt":
            return (current >= 0) & (current < prompt)
        if positions == "answer":
            return current >= prompt
        if positions == "last":
            return current == prompt - 1
        wanted = torch.tensor(positions, device=current.device)[None]
        wanted = torch.where(wanted < 0, prompt + wanted, wanted)  # (B, k)
        outside = (wanted < 0) | (wanted >= prompt)
        if bool(outside.any()):
            sample = int(outside.any(1).nonzero()[0, 0])
            raise ConfigError(f"{where}: positions={_said(positions)} lies beyond a prompt of "
                              f"{int(self.prompt[sample])} positions (the batch's sample "
                              f"{sample}); use positions that every sample has")
        return (current[..., None] == wanted[:, None, :]).any(-1)


_DECODER_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds", "encoder_outputs")


def _last_alone(value: torch.Tensor, current: torch.Tensor | None) -> bool:
    # generate() asks the head for the logits of the call's last position alone
    return (current is not None and value.dim() >= 3 and current.shape[1] > 1
            and value.shape[0] == current.shape[0] and value.shape[1] == 1)


def _said(positions) -> str:
    return positions if isinstance(positions, str) else str(list(positions))


def _positions(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """Each token's position in a model's call (-1 for padding), from the attention mask it is
    given; where it is given none (generate() leaves it out of a batch without padding), from
    its position ids, or its cache positions; None where the call has no tokens."""
    tokens = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    if tokens is None and args and isinstance(args[0], torch.Tensor):
        tokens = args[0]
    if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
        return None
    batch, length = tokens.shape[:2]
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[1] >= length:
        real = mask[:, -length:].bool()
        return torch.where(real, mask.long().cumsum(1)[:, -length:] - 1, -1)
    if mask is not None:
        return None  # a mask of the model's own making: not read here
    given = kwargs.get("position_ids", kwargs.get("cache_position"))
    if isinstance(given, torch.Tensor) and given.shape[-1] == length:
        return given.long().expand(batch, length)
    if kwargs.get("past_key_values", kwargs.get("cache")) is None:
        return torch.arange(length, device=tokens.device).expand(batch, length)
    return None
