"""Sizes for people: ``human_bytes(802816)`` -> ``'784.0 KiB'``."""

from __future__ import annotations

__all__ = ["human_bytes"]


def human_bytes(size: float) -> str:
    """Bytes in the largest unit (B, KiB, MiB, GiB, TiB) that keeps the number at least 1."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
