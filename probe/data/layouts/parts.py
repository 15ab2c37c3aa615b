"""The layout of a model of parts that see different positions: ``ImageText(text, parts)``, a
vision-language batch's. Its language model's values follow ``text`` (a ``Positions`` with
/modality and /patch, image placeholders included); the vision tower's and the projector's,
by the module names each starts at, their own layout (a row per image), or a line that
refuses them for this batch."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from probe.config.schema import Reduce, Tokens
from probe.data.layouts.base import Axes, RowLayout, Rows, Stored
from probe.data.layouts.positions import Positions
from probe.errors import ConfigError
from probe.file.format import DatasetSpec, split_key

__all__ = ["ImageText"]


@dataclass(frozen=True)
class ImageText:
    """A vision-language batch's rows (see the module's docstring): ``text``, the language
    model's positions (image placeholders included), and ``parts``: for the vision tower and
    the projector, the module names each starts at and the layout of its values (a row per
    image), or the line that refuses its layers (a batch whose images are not one per
    sample: tiles, several images, patches of all images in one sequence)."""

    text: Positions
    parts: tuple[tuple[tuple[str, ...], RowLayout | str], ...] = ()

    @property
    def lengths(self) -> torch.Tensor | None:
        return self.text.lengths

    @property
    def bounded_lengths(self) -> dict[str, torch.Tensor]:
        return self.text.bounded_lengths

    def _part(self, layer: str) -> RowLayout | str | None:
        for roots, part in self.parts:
            if any(layer == root or layer.startswith(f"{root}.") for root in roots):
                return part
        return None

    def _of(self, key: str) -> RowLayout:
        # the layout that ``key``'s values follow: the language model's, or its part's
        part = self._part(split_key(key)[0])
        if isinstance(part, str):
            return _Refused(part)
        return self.text if part is None else part

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return self._of(key).follows(key, shape, axes)

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        return self._of(key).stored(key, shape, axes, pool, reduce)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        return self._of(key).select(key, value, axes, pool)

    def check(self, plain: list[str], gradients: bool) -> None:
        # a vision part's plain keys (a pooled output, a convolution's map) are a row per
        # image, which is a row per sample here: only the language model's follow its rows
        text = []
        for key in plain:
            part = self._part(split_key(key)[0])
            if isinstance(part, str):
                raise ConfigError(part)
            if part is None:
                text.append(key)
        self.text.check(text, gradients)

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return self.text.bookkeeping()

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return self.text.bookkeeping_rows

    def describe(self) -> str | None:
        said = [self.text.describe() or "token rows: each sample's processed sequence, image "
                                        "placeholders included (/modality, /patch)"]
        for roots, part in self.parts:
            what = part if isinstance(part, str) else part.describe() or "a row per image"
            said.append(f"{', '.join(roots)}: {what}")
        return "; ".join(said)

    def with_positions(self, make) -> ImageText:
        return replace(self, text=make(self.text))


@dataclass(frozen=True)
class _Refused(Rows):
    """The layout of a model part whose layers this batch cannot store: each ask says why."""

    line: str

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return False

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        raise ConfigError(self.line)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        raise ConfigError(self.line)
