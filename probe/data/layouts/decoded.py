"""The layout of an encoder-decoder's batch: ``Decoded(source, target, encoder)``. The
encoder's values follow ``source`` (the text's tokens, bounded by /offsets); every other
value (the decoder's blocks, their cross-attention, the head) follows ``target``: the decoder's
positions, one per target token, teacher-forced, bounded by their own /decoder_offsets, with
the token each reads in /decoder_input_ids. Where the batch has no target, the decoder sees its
start token alone (``target``: that one position) and ``refusal`` says why its layers are not
stored: never as if that token's row were the text's. A generation's layout answers them
instead (probe.pipeline.generation_decoded).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from probe.config.schema import Reduce, Tokens
from probe.data.layouts.base import Axes, RowLayout, Rows, Stored
from probe.data.layouts.positions import Positions
from probe.errors import ConfigError
from probe.file.format import DatasetSpec, split_key

__all__ = ["Decoded"]


@dataclass(frozen=True)
class Decoded:
    """An encoder-decoder's batch (see the module's docstring). ``encoder``: the names of
    the encoder's module (its path, and the standard names' ``encoder``), under which a
    layer's values follow ``source``; ``refusal``: the line that refuses the decoder's layers
    (a ``{layer}`` in it names one), where the batch has no target."""

    source: Positions
    target: Positions
    encoder: tuple[str, ...]
    refusal: str | None = None

    @property
    def lengths(self) -> torch.Tensor | None:
        return self.source.lengths

    @property
    def bounded_lengths(self) -> dict[str, torch.Tensor]:
        return {**self.source.bounded_lengths, **self._target().bounded_lengths}

    def _target(self) -> RowLayout:
        return self.target if self.refusal is None else Rows()

    def _refuse(self, key: str) -> None:
        if self.refusal is not None:
            raise ConfigError(self.refusal.format(layer=split_key(key)[0]))

    def in_encoder(self, layer: str) -> bool:
        return any(layer == root or layer.startswith(f"{root}.") for root in self.encoder)

    def _of(self, key: str) -> RowLayout:
        return self.source if self.in_encoder(split_key(key)[0]) else self.target

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return self._of(key).follows(key, shape, axes)

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        if not self.in_encoder(split_key(key)[0]):
            self._refuse(key)
        return self._of(key).stored(key, shape, axes, pool, reduce)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        return self._of(key).select(key, value, axes, pool)

    def check(self, plain: list[str], gradients: bool) -> None:
        decoder = [key for key in plain if not self.in_encoder(split_key(key)[0])]
        if decoder:
            self._refuse(decoder[0])
        self.target.check(decoder, gradients)
        self.source.check([key for key in plain if key not in decoder], gradients)

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return {**self.source.bookkeeping(), **self._target().bookkeeping()}

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return {**self.source.bookkeeping_rows, **self._target().bookkeeping_rows}

    def describe(self) -> str | None:
        if self.refusal is not None:
            return self.source.describe()
        return ("token rows: the encoder's, one per token of the text (/offsets, /input_ids); "
                "the decoder's, one per token of the target (teacher-forced) or of the answer "
                "(generated), each the row that predicts it (/decoder_offsets, "
                "/decoder_input_ids: the token each row reads)")

    def with_positions(self, make) -> Decoded:
        return replace(self, source=make(self.source))
