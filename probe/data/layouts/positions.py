"""Layouts of ragged positions: a mask of the real ones per sample, never padding.

    Positions(keep, rows)         ``keep`` (B, L) marks the real positions (a language model's
                                  tokens, an audio encoder's frames); ``tokens=all`` stores a
                                  row per kept position, which the file's /offsets bound per
                                  sample
    Pieces(keep, piece_sample)    the same for a sample fed as several rows of the model's
                                  input, in order (a long recording's windows): its rows are
                                  joined, and pooled as one
    Answered(keep, rows, most)    prompts and the answers a model generated for them: the
                                  positions of one sequence per sample (its prompt, then each
                                  new token), ``rows`` marking the generated ones; every key
                                  must have the token axis, and gradients are refused
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from probe.config.schema import GeneratedRows, Reduce, Tokens
from probe.data.layouts.base import Axes, Rows, Stored, feature_pooling
from probe.errors import ConfigError
from probe.file.format import OFFSETS, VALUE_NAMES, Attr, DatasetSpec, split_key

__all__ = ["Positions", "Pieces", "Answered"]


@dataclass(frozen=True)
class Positions(Rows):
    """Ragged positions, ``keep`` (B, L) marking the real ones (see the module's docstring).

    ``rows``: bookkeeping per kept position, in order ({"input_ids": (kept,), ...}); ``axis``
    names a position in the file's ``dims`` attr ("token", "frame"); ``answer_fill``: the
    value of a bookkeeping row that the feed made (a vision-language model's /modality,
    /patch) on a position that a generation adds; ``bounds``: the dataset that bounds each
    sample's rows (/offsets; an encoder-decoder's decoder has its own).
    """

    keep: torch.Tensor
    rows: dict[str, torch.Tensor] = field(default_factory=dict)
    axis: str = "token"
    bounds: str = OFFSETS
    lengths: torch.Tensor | None = field(default=None, compare=False)
    answer_fill: dict[str, int] = field(default_factory=dict, compare=False)
    # ``keep`` on each device that a value was selected on, moved there once
    _moved: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.lengths is None:  # counted once, on the CPU where the batch was made
            object.__setattr__(self, "lengths", self._lengths())

    def _lengths(self) -> torch.Tensor:
        return self.keep.sum(1)

    @property
    def bounded_lengths(self) -> dict[str, torch.Tensor]:
        return {self.bounds: self.lengths}

    @property
    def length(self) -> int:
        return int(self.keep.shape[1])

    def follows(self, key: str, shape: tuple[int, ...], axes: Axes) -> bool:
        return axes.follows(self.length, shape)

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        rows, names = axes.others(shape), axes.others(axes.dims(len(shape), self.axis))
        attrs = {} if self.bounds == OFFSETS else {Attr.OFFSETS: self.bounds}
        if axes.keys:  # padded to the longest sample's positions
            if axes.longest is None:
                raise ConfigError(
                    f"{key}: storing {axes.what}s of {self.axis}s needs a bound on a sample's "
                    f"{self.axis}s, its {names[-1]}s; set dataset.max_length")
            rows = (*rows[:-1], axes.longest)
            attrs[Attr.KEYS] = (f"{axes.longest}: a sample's {names[-1]}s first, zeros after "
                                "its length")
        if pool is Tokens.patches:
            raise ConfigError(
                f"tokens=patches on {key}, a token layout of {shape[axes.position]} "
                f"{self.axis}s without a patch grid: patches are a vision transformer's; use "
                "tokens=all, first, last or mean")
        if pool is Tokens.all:
            if reduce in (Reduce.mean, Reduce.max):
                raise ConfigError(feature_pooling(key, reduce, f"whose rows are its "
                                                  f"{self.axis}s ({self.axis}s, features)",
                                                  "tokens=mean (or first, last)"))
            return Stored(rows, (self.axis, *names), True, attrs)
        return Stored(rows, ("sample", *names), False, attrs)

    def select(self, key: str, value: torch.Tensor, axes: Axes, pool: Tokens) -> torch.Tensor:
        if axes.position:  # the positions first, as the rows are taken along them
            value = value.movedim(1 + axes.position, 1)
        rows = self._pooled(value, pool)
        if axes.keys:  # a sample's keys first (a batch is padded on the right), zeros after
            rows = nn.functional.pad(rows, (0, axes.longest - rows.shape[-1]))
        return rows

    def _pooled(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        # the kept positions of a (B, L, ...) value, or one pooled row per sample
        keep = self._keep_on(value.device)
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

    def _keep_on(self, device: torch.device) -> torch.Tensor:
        if self.keep.device == device:
            return self.keep
        if device not in self._moved:
            self._moved[device] = self.keep.to(device, non_blocking=True)
        return self._moved[device]

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        specs = {}
        for name, values in self.rows.items():
            # a row of several values (/patch's row and column) names its axis by the dataset
            attrs = {Attr.DIMS: [self.axis, *([f"{name}_axis"] if values.dim() > 1 else [])]}
            if name in VALUE_NAMES:
                attrs[Attr.VALUES] = list(VALUE_NAMES[name])
            specs[name] = DatasetSpec(tuple(values.shape[1:]),
                                      str(values.dtype).removeprefix("torch."), attrs,
                                      compressible=False, per_position=True,
                                      bounds=self.bounds)
        return specs

    @property
    def bookkeeping_rows(self) -> dict[str, torch.Tensor]:
        return self.rows

    def with_positions(self, make) -> Positions:
        return make(self)


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

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        if axes.keys:
            raise ConfigError(f"{key}: the {axes.what}s of a sample fed in pieces are not "
                              "joined into one; feed whole samples (e.g. without "
                              "dataset.window_seconds)")
        return super().stored(key, shape, axes, pool, reduce)

    def _pooled(self, value: torch.Tensor, pool: Tokens) -> torch.Tensor:
        # the kept positions of all rows, in order: each sample's form one block
        rows = value[self._keep_on(value.device)]
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

    def stored(self, key: str, shape: tuple[int, ...], axes: Axes, pool: Tokens,
               reduce: Reduce) -> Stored:
        if axes.keys:
            names = axes.dims(len(shape), self.axis)
            raise ConfigError(
                f"{key}: {axes.what}s are not stored while a model generates (each step adds "
                f"a {names[axes.position]} and a {names[-1]}); store them without "
                "generate.max_new_tokens, on prompt + completion as token ids")
        return super().stored(key, shape, axes, pool, reduce)

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
