"""Row layouts: how the position axis of a captured tensor becomes stored rows.

Every batch has a layout. An output follows it when its second axis is the layout's positions
((B, length, ...)); for such an output the layout says which positions count, how ``tokens=``
pools them, what one stored row is and how its axes are named, and which bookkeeping rows go
with them. The per-key transform, the hooks, the dry run and the runner ask the layout and
never look inside it, so a new kind of rows is one more class here.

    SAMPLE_ROWS                   one row per sample: outputs with no position axis (conv
                                  maps, logits); also how outputs that follow no layout store
    Positions(keep, bookkeeping)  ragged positions: ``keep`` (B, L) marks the real ones (a
                                  language model's tokens, an audio encoder's frames, never
                                  padding); ``tokens=all`` stores a row per kept position,
                                  which the file's /offsets bound per sample
    Pieces(keep, piece_sample)    the same for a sample fed as several rows of the model's
                                  input, in order (a long recording's windows): its rows
                                  are joined, and pooled as one
    Answered(keep, rows, most, ..) prompts and the answers a model generated for them: the
                                  positions of one sequence per sample (its prompt, then each
                                  new token), ``rows`` marking the generated ones; every key
                                  must have the token axis, and gradients are refused
    PatchGrid(prefix, grid)       a fixed run of ``prefix`` special positions (class, register
                                  tokens) then patches on a (rows, columns) grid: a vision
                                  transformer's; ``tokens=patches`` lays the patches out as a
                                  (features, rows, columns) map
    ImageText(text, parts)        a vision-language model's: its language model's positions
                                  (``text``, a Positions with /modality and /patch) and, by
                                  the module names of its vision tower and projector, the
                                  layout of each (a row per image); ``rows_for`` says which
                                  layout a layer's values follow
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import torch
from torch import nn

from probe.config.schema import GeneratedRows, Reduce, Tokens
from probe.errors import ConfigError
from probe.file.format import VALUE_NAMES, Attr, DatasetSpec, split_key

__all__ = ["RowLayout", "SampleRows", "SAMPLE_ROWS", "Positions", "Pieces", "Answered",
           "PatchGrid", "ImageText", "plain_dims", "feature_dims"]


class RowLayout(Protocol):
    """What every layout answers (see the module's docstring)."""

    length: int | None  # the positions along an output's second axis; None: no such axis
    # (samples,) on the CPU: the rows each sample stores with tokens=all, where those are one
    # per position; None otherwise
    lengths: torch.Tensor | None

    def follows(self, shape: tuple[int, ...]) -> bool:
        """Whether a captured (B, ...) tensor of ``shape`` has this layout's position axis."""

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        """For a key that follows the layout, whose rows before pooling are ``rows`` (the
        shape after the batch axis): the stored row's shape, the name of every stored axis
        (rows first), and whether rows are one per position.

        Raises:
            ConfigError: a pool or reduce that this layout's rows cannot take.
        """

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        """The stored rows of a (B, length, ...) value of a key that follows the layout."""

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        """For an attention pattern ``key`` of (heads, queries, keys) per sample: the stored
        row's shape, its axes' names (rows first), and whether rows are one per position;
        ``keys``: the most positions a sample has, where they vary.

        Raises:
            ConfigError: a pool this layout's patterns cannot take, or patterns it cannot
                store.
        """

    def select_pattern(self, value: torch.Tensor, pool: Tokens, keys: int | None
                       ) -> torch.Tensor:
        """The stored rows of a (B, heads, queries, keys) pattern."""

    def check(self, plain: list[str], gradients: bool) -> None:
        """Refuse what this layout cannot store: keys that follow no layout (``plain``), or
        gradients.

        Raises:
            ConfigError: naming what to leave out.
        """

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        """The datasets of one row per kept position that go with the rows (token ids,
        positions, ...), filled from ``bookkeeping_rows``."""

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        """This batch's values of ``bookkeeping()``, one per kept position, on the CPU."""

    def to(self, device: torch.device) -> RowLayout:
        """The layout with what ``select`` reads on ``device`` (the CPU bookkeeping stays)."""

    def describe(self) -> str | None:
        """The layout in words, for ``python -m probe.layers``; None where there is nothing
        to say."""

    @property
    def sequence(self) -> Positions | None:
        """The rows of the positions along the model's input sequence (a text layout's own,
        the language-model part of a vision-language batch's), which a generation extends;
        None for a layout without."""

    def with_sequence(self, sequence: Positions) -> RowLayout:
        """This layout with ``sequence`` in place of its own (a generation's rows)."""

    def rows_for(self, layer: str) -> RowLayout:
        """The layout that ``layer``'s values follow: this one, or (a vision-language
        batch's) that of the model's part the layer belongs to."""


def feature_dims(axes: int) -> tuple[str, ...]:
    """The names of the axes after a position axis: its features."""
    return ("feature",) if axes == 1 else tuple(f"feature{n}" for n in range(axes))


def plain_dims(axes: int) -> tuple[str, ...]:
    """The names of a per-sample row's axes (``axes`` after the batch axis), as PyTorch's
    layers lay them out: features, or channels then space."""
    if axes <= 1:
        return ("sample", "feature")[: axes + 1]
    spatial = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
    return ("sample", "channel", *spatial.get(axes - 1, tuple(f"axis{n}" for n in
                                                              range(2, axes + 1))))


class _Rows:
    """What a layout does where it has nothing to add: no refusals, no bookkeeping, nothing
    on a device, nothing to say; an attention pattern per sample, as inputs of one fixed
    length give it (every position real)."""

    lengths = None

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        heads, queries, length = pattern
        if pool is Tokens.all:
            return pattern, ("sample", "head", "query", "key"), False
        if pool is Tokens.patches:
            raise ConfigError(f"tokens=patches on {key}, an attention pattern: use tokens=all "
                              "(every query's row), first, last or mean (one query row)")
        return (heads, length), ("sample", "head", "key"), False

    def select_pattern(self, value: torch.Tensor, pool: Tokens, keys: int | None
                       ) -> torch.Tensor:
        if pool is Tokens.all:
            return value
        if pool is Tokens.mean:
            return value.mean(2, dtype=torch.promote_types(value.dtype, torch.float32))
        return value[:, :, 0] if pool is Tokens.first else value[:, :, -1]

    def check(self, plain: list[str], gradients: bool) -> None:
        pass

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return {}

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return {}

    def to(self, device: torch.device):
        return self

    def describe(self) -> str | None:
        return None

    @property
    def sequence(self) -> Positions | None:
        return None

    def with_sequence(self, sequence: Positions) -> RowLayout:
        return sequence

    def rows_for(self, layer: str) -> RowLayout:
        return self


@dataclass(frozen=True)
class SampleRows(_Rows):
    """One row per sample (see the module's docstring)."""

    length = None

    def follows(self, shape: tuple[int, ...]) -> bool:
        return False

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        return rows, plain_dims(len(rows)), False

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        return value


SAMPLE_ROWS = SampleRows()


def _follows(length: int, shape: tuple[int, ...]) -> bool:
    return len(shape) >= 3 and shape[1] == length


@dataclass(frozen=True)
class Positions(_Rows):
    """Ragged positions, ``keep`` (B, L) marking the real ones (see the module's docstring).

    ``rows``: bookkeeping per kept position, in order ({"input_ids": (kept,), ...}); ``axis``
    names a position in the file's ``dims`` attr ("token", "frame"); ``answer_fill``: the
    value of a bookkeeping row that the feed made (a vision-language model's /modality,
    /patch) on a position that a generation adds.
    """

    keep: torch.Tensor
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    axis: str = "token"
    lengths: torch.Tensor | None = field(default=None, compare=False)
    answer_fill: dict[str, int] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.lengths is None:  # counted once, on the CPU where the batch was made
            object.__setattr__(self, "lengths", self._lengths())

    def _lengths(self) -> torch.Tensor:
        return self.keep.sum(1)

    @property
    def length(self) -> int:
        return int(self.keep.shape[1])

    def follows(self, shape: tuple[int, ...]) -> bool:
        return _follows(self.length, shape)

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        if pool is Tokens.patches:
            raise ConfigError(
                f"tokens=patches on {key}, a token layout of {rows[0]} {self.axis}s without a "
                "patch grid: patches are a vision transformer's; use tokens=all, first, last "
                "or mean")
        if pool is Tokens.all:
            if reduce in (Reduce.mean, Reduce.max):
                raise ConfigError(_feature_pooling(key, reduce, f"whose rows are its "
                                                   f"{self.axis}s ({self.axis}s, features)",
                                                   "tokens=mean (or first, last)"))
            return rows[1:], (self.axis, *feature_dims(len(rows) - 1)), True
        return rows[1:], ("sample", *feature_dims(len(rows) - 1)), False

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        keep = self.keep
        if value.shape[:2] != keep.shape:
            raise ValueError(f"an output of shape {tuple(value.shape)} for a batch whose "
                             f"positions are {tuple(keep.shape)}")
        if pool is Tokens.all:
            return value[keep]
        rows = torch.arange(len(value), device=value.device)
        if pool is Tokens.first:
            return value[rows, keep.int().argmax(1)]
        if pool is Tokens.last:
            return value[rows, keep.shape[1] - 1 - keep.flip(1).int().argmax(1)]
        weights = keep.to(torch.promote_types(value.dtype, torch.float32))
        weights = weights / weights.sum(1, keepdim=True)
        return torch.einsum("bl...,bl->b...", value.to(weights.dtype), weights)

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        if keys is None:
            raise ConfigError(f"{key}: an attention pattern of {self.axis}s needs a bound on "
                              f"a sample's {self.axis}s, its keys; set dataset.max_length")
        if pool is Tokens.patches:
            raise ConfigError(f"tokens=patches on {key}, an attention pattern: use tokens=all "
                              "(a row per token), first, last or mean (one per sample)")
        heads = pattern[0]
        if pool is Tokens.all:
            return (heads, keys), (self.axis, "head", "key"), True
        return (heads, keys), ("sample", "head", "key"), False

    def select_pattern(self, value: torch.Tensor, pool: Tokens, keys: int | None
                       ) -> torch.Tensor:
        # (B, heads, queries, keys) -> the kept queries' rows (heads, keys), the sample's keys
        # first (a batch is padded on the right), zeros after them, up to ``keys``
        rows = self.select(value.transpose(1, 2), pool)
        return nn.functional.pad(rows, (0, keys - rows.shape[-1]))

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        specs = {}
        for name, values in self.rows.items():
            # a row of several values (/patch's row and column) names its axis by the dataset
            attrs = {Attr.DIMS: [self.axis, *([f"{name}_axis"] if values.dim() > 1 else [])]}
            if name in VALUE_NAMES:
                attrs[Attr.VALUES] = list(VALUE_NAMES[name])
            specs[name] = DatasetSpec(tuple(values.shape[1:]),
                                      str(values.dtype).removeprefix("torch."), attrs,
                                      compressible=False, per_position=True)
        return specs

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return self.rows

    def to(self, device: torch.device) -> Positions:
        return replace(self, keep=self.keep.to(device, non_blocking=True), lengths=self.lengths)

    @property
    def sequence(self) -> Positions:
        return self


@dataclass(frozen=True)
class Pieces(Positions):
    """Ragged positions of samples fed as several rows each: ``piece_sample`` (rows,) is the
    sample (0 .. B - 1) of each row of ``keep``, a sample's rows consecutive and in order."""

    piece_sample: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def _lengths(self) -> torch.Tensor:
        per_row = self.keep.sum(1)
        samples = int(self.piece_sample.max()) + 1 if len(self.piece_sample) else 0
        return torch.zeros(samples, dtype=per_row.dtype).index_add_(
            0, self.piece_sample.cpu(), per_row.cpu())

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        # the kept positions of all rows, in order: each sample's form one block
        rows = value[self.keep]
        if pool is Tokens.all:
            return rows
        lengths = self.lengths.to(value.device)
        ends = lengths.cumsum(0)
        if pool is Tokens.first:
            return rows[ends - lengths]
        if pool is Tokens.last:
            return rows[ends - 1]
        dtype = torch.promote_types(value.dtype, torch.float32)
        owner = torch.repeat_interleave(torch.arange(len(lengths), device=value.device), lengths)
        sums = torch.zeros((len(lengths), *rows.shape[1:]), dtype=dtype, device=value.device)
        sums.index_add_(0, owner, rows.to(dtype))
        return sums / lengths.view(-1, *[1] * (rows.dim() - 1)).to(dtype)

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        raise ConfigError(f"{key}: the attention patterns of a sample fed in pieces are not "
                          "joined into one; feed whole samples (e.g. without "
                          "dataset.window_seconds)")

    def check(self, plain: list[str], gradients: bool) -> None:
        if plain:
            raise ConfigError(
                f"{plain[0]} has no {self.axis} axis, so the rows of a sample fed in pieces "
                f"cannot be joined; leave {split_key(plain[0])[0]!r} out, or feed whole samples "
                "(e.g. without dataset.window_seconds)")
        if gradients:
            raise ConfigError(
                "gradients of a sample fed in pieces are not joined into one; feed whole "
                "samples for gradient hooks (e.g. leave dataset.window_seconds unset)")


@dataclass(frozen=True)
class Answered(Positions):
    """The token positions of prompts and of the answers generated for them (see the module's
    docstring): ``keep`` (B, L) over each sample's whole sequence as the model saw it, step by
    step; ``most`` is how many new tokens a sample can have (for ``describe``)."""

    most: int = 0
    rows_kept: GeneratedRows = GeneratedRows.all  # generate.rows: whose rows are stored

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        raise ConfigError(f"{key}: attention patterns are not stored while a model generates "
                          "(each step adds a query and a key); store them without "
                          "generate.max_new_tokens, on prompt + completion as token ids")

    def check(self, plain: list[str], gradients: bool) -> None:
        if plain:
            raise ConfigError(
                f"{plain[0]} has no token axis: while a model generates, every step adds "
                f"tokens, and only rows per token follow them; leave {split_key(plain[0])[0]!r} "
                "out of a generating run (generate.max_new_tokens)")
        if gradients:
            raise ConfigError(
                "gradients are not taken while a model generates (hooks=[backward] asks for a "
                "fixed input): store the answers first (/completion), then run objective=nll "
                "with dataset=tokens on prompt + completion, without generate.max_new_tokens")

    def describe(self) -> str | None:
        return {GeneratedRows.all: f"token rows: each sample's prompt, then up to {self.most} "
                                   "generated tokens (its end token included), marked in "
                                   "/generated",
                GeneratedRows.prompt: "token rows: each sample's prompt alone "
                                      f"(generate.rows=prompt); its answer of up to "
                                      f"{self.most} tokens is in /completion",
                GeneratedRows.answer: f"token rows: up to {self.most} per sample, its "
                                      "generated tokens (its end token included; "
                                      "generate.rows=answer)"}[self.rows_kept]


@dataclass(frozen=True)
class PatchGrid(_Rows):
    """``prefix`` special positions, then patches on ``grid`` (rows, columns), row by row, as
    vision transformers lay them out; every position counts."""

    prefix: int
    grid: tuple[int, int]

    @property
    def length(self) -> int:
        return self.prefix + self.grid[0] * self.grid[1]

    def follows(self, shape: tuple[int, ...]) -> bool:
        return _follows(self.length, shape)

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        features = feature_dims(len(rows) - 1)
        if pool is Tokens.all:
            if reduce in (Reduce.mean, Reduce.max):
                raise ConfigError(_feature_pooling(
                    key, reduce, "(N, tokens, features)", "tokens=first (the class token), "
                    "last or mean, or tokens=patches to pool the patch grid"))
            return rows, ("sample", "token", *features), False
        if pool is Tokens.patches:
            if len(rows) != 2:
                raise ConfigError(f"tokens=patches on {key}, whose rows are {rows}: patches "
                                  "need (tokens, features) rows; use tokens=all, first, last "
                                  "or mean")
            return (rows[1], *self.grid), ("sample", "feature", "height", "width"), False
        return rows[1:], ("sample", *features), False

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        if pool is Tokens.all:
            return value
        if pool is Tokens.patches:  # (B, D, rows, columns), patches in row-major order
            return value[:, self.prefix:].unflatten(1, self.grid).movedim(-1, 1)
        if pool is Tokens.mean:
            return value.mean(1, dtype=torch.promote_types(value.dtype, torch.float32))
        return value[:, 0] if pool is Tokens.first else value[:, -1]

    def describe(self) -> str | None:
        rows, columns = self.grid
        return (f"token layout: {self.length} tokens = {self.prefix} class/register token(s) "
                f"+ {rows}x{columns} patches; tokens=patches stores (features, {rows}, "
                f"{columns})")


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
    def length(self) -> int:
        return self.text.length

    @property
    def lengths(self) -> torch.Tensor | None:
        return self.text.lengths

    @property
    def sequence(self) -> Positions:
        return self.text

    def with_sequence(self, sequence: Positions) -> ImageText:
        return replace(self, text=sequence)

    def rows_for(self, layer: str) -> RowLayout:
        part = self._part(layer)
        if isinstance(part, str):
            return _Refused(part)
        return self.text if part is None else part

    def _part(self, layer: str) -> RowLayout | str | None:
        for roots, part in self.parts:
            if any(layer == root or layer.startswith(f"{root}.") for root in roots):
                return part
        return None

    # a caller that does not ask ``rows_for`` gets the language model's rows
    def follows(self, shape: tuple[int, ...]) -> bool:
        return self.text.follows(shape)

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        return self.rows_for(split_key(key)[0]).stored(key, rows, pool, reduce)

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        return self.text.select(value, pool)

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        return self.rows_for(split_key(key)[0]).stored_pattern(key, pattern, pool, keys)

    def select_pattern(self, value: torch.Tensor, pool: Tokens, keys: int | None
                       ) -> torch.Tensor:
        return self.text.select_pattern(value, pool, keys)

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

    def to(self, device: torch.device) -> ImageText:
        parts = tuple((roots, part if isinstance(part, str) else part.to(device))
                      for roots, part in self.parts)
        return replace(self, text=self.text.to(device), parts=parts)

    def describe(self) -> str | None:
        said = [self.text.describe() or "token rows: each sample's processed sequence, image "
                                        "placeholders included (/modality, /patch)"]
        for roots, part in self.parts:
            what = part if isinstance(part, str) else part.describe() or "a row per image"
            said.append(f"{', '.join(roots)}: {what}")
        return "; ".join(said)


@dataclass(frozen=True)
class _Refused(_Rows):
    """The layout of a model part whose layers this batch cannot store: each asks says why."""

    line: str
    length = None

    def follows(self, shape: tuple[int, ...]) -> bool:
        return False

    def stored(self, key: str, rows: tuple[int, ...], pool: Tokens, reduce: Reduce
               ) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        raise ConfigError(self.line)

    def stored_pattern(self, key: str, pattern: tuple[int, int, int], pool: Tokens,
                       keys: int | None) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
        raise ConfigError(self.line)

    def select(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        raise ConfigError(self.line)


def _feature_pooling(key: str, reduce: Reduce, rows: str, instead: str) -> str:
    # the axes after a position axis are its features, not space
    return (f"reduce={reduce.name} on {key}, a token layout {rows}: it would {reduce.name}-pool "
            f"the feature axis; pool the tokens instead with {instead}, or leave this layer out "
            f"of the reduce ('reduce_by_layer={{{split_key(key)[0]}:none}}')")

