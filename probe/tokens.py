"""Rows from token layouts: a captured (batch, sequence, ...) tensor becomes one row per real
token, or one row per sample (the first, the last or the mean of its real tokens).

``keep`` (batch, sequence) marks the positions that count: a language model's real tokens
(never its padding, nor special tokens left out), or None where every position is real (a
vision transformer's tokens).
"""

from __future__ import annotations

import torch

from probe.config import Tokens

__all__ = ["select_tokens", "is_vision_transformer"]

# transformer blocks whose 3-D outputs are (batch, tokens, features): timm's ViT family (ViT,
# DeiT, DINOv2, CLIP and SigLIP towers, EVA, BEiT) and torchvision's vit_* / swin-free ViTs
_VISION_BLOCKS = ("timm.models.", "torchvision.models.vision_transformer")


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


def is_vision_transformer(model) -> bool:
    """Whether an image model is a vision transformer: it holds a transformer block of timm or
    torchvision, so that its 3-D outputs are (batch, tokens, features)."""
    return any(type(m).__module__.startswith(_VISION_BLOCKS)
               and type(m).__name__.endswith(("Block", "EncoderBlock")) and _has_attention(m)
               for m in model.modules())


def _has_attention(module) -> bool:
    return any("attn" in name or "attention" in name for name, _ in module.named_children())
