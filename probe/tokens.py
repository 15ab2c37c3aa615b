"""Rows from token layouts: a captured (batch, sequence, ...) tensor becomes one row per real
token, or one row per sample (the first, the last or the mean of its real tokens).

``keep`` (batch, sequence) marks the positions that count: a language model's real tokens
(never its padding, nor special tokens left out), or None where every position is real (a
vision transformer's tokens).
"""

from __future__ import annotations

import torch

from probe.config import Tokens

__all__ = ["select_tokens"]


def select_tokens(value: torch.Tensor, keep: torch.Tensor | None, how: Tokens) -> torch.Tensor:
    """The rows ``how`` asks for of a (B, L, ...) tensor.

    ``all``: (number of kept positions, ...) in batch order, or the tensor itself when ``keep``
    is None; ``first``, ``last``, ``mean``: (B, ...). The mean is taken in float32 at least.
    """
    if keep is None:
        if how is Tokens.all:
            return value
        if how is Tokens.mean:
            return value.mean(1, dtype=torch.promote_types(value.dtype, torch.float32))
        return value[:, 0] if how is Tokens.first else value[:, -1]
    if value.shape[:2] != keep.shape:
        raise ValueError(f"a token layout of shape {tuple(value.shape)} for a batch whose tokens "
                         f"are {tuple(keep.shape)}")
    if how is Tokens.all:
        return value[keep]
    rows = torch.arange(len(value), device=value.device)
    if how is Tokens.first:
        return value[rows, keep.int().argmax(1)]
    if how is Tokens.last:
        return value[rows, keep.shape[1] - 1 - keep.flip(1).int().argmax(1)]
    weights = keep.to(torch.promote_types(value.dtype, torch.float32))
    weights = weights / weights.sum(1, keepdim=True)
    return torch.einsum("bl...,bl->b...", value.to(weights.dtype), weights)
