"""How a key's rows become the values the file stores: cast to float32, float16 or bfloat16, or
encoded as float8 (e4m3 bytes and one float32 scale per row). Each encoding says what it
stores, on the rows' device, and reads it back (``decode``) the way a file's readers do
(probe.file.encodings), so that the fidelity report measures what a reader will see.

    encoding = encoding_for(torch.float8_e4m3fn)
    parts = encoding.encode("layer/output", rows, scaled_axes=1)   # {"layer/output": bytes,
                                                                   #  "layer/output_scale": ...}
    encoding.check()         # a value the encoding cannot hold, found in the batch: one line
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import torch

from probe.errors import ConfigError
from probe.file.encodings import FLOAT8, FLOAT8_MAX, decode_float8, float8_table
from probe.file.format import Attr, DatasetSpec, scale_key, split_key

__all__ = ["Encoding", "Cast", "Float8", "encoding_for"]

_FLOAT16_LIMIT = 65520.0  # the smallest magnitude that float16 rounds to infinity
_SMALLEST = 2.0 ** -149  # float32's smallest positive (subnormal) value


class Encoding:
    """What every encoding answers (see the module's docstring); ``dtype`` is the stored type
    (None keeps the rows'), ``compact`` whether it loses precision against float32."""

    dtype: torch.dtype | None = None
    compact: bool = False

    def __init__(self):
        self._flags: list[tuple[str, torch.Tensor]] = []  # (key, a value it cannot hold)

    def encode(self, key: str, rows: torch.Tensor, scaled_axes: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def decode(self, key: str, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The float32 rows a reader gets from ``parts`` (on the CPU)."""
        return parts[key].float()

    def specs(self, key: str, spec: DatasetSpec, scaled_axes: int) -> dict[str, DatasetSpec]:
        """The datasets that hold ``key``: its own (``spec``), and any beside it."""
        return {key: spec}

    def check(self) -> None:
        """Refuse a value found since the last check that the encoding cannot hold.

        Raises:
            ConfigError: naming the key, what happens to such a value, and the fix.
        """
        flags, self._flags = self._flags, []
        for key, flag in flags:
            if bool(flag):
                raise ConfigError(self.problem(key))

    def problem(self, key: str) -> str:
        raise NotImplementedError


class Cast(Encoding):
    """Rows in a floating type: float32, float16 (a value beyond its range is refused: it would
    be stored as an infinity), bfloat16 (its raw bits in the file)."""

    def __init__(self, dtype: torch.dtype | None):
        super().__init__()
        self.dtype = dtype
        self.compact = dtype in (torch.float16, torch.bfloat16)

    def encode(self, key: str, rows: torch.Tensor, scaled_axes: int) -> dict[str, torch.Tensor]:
        dtype = self.dtype or rows.dtype
        if dtype == torch.float16 and rows.dtype != torch.float16:
            self._flags.append((key, (rows.abs() >= _FLOAT16_LIMIT).any()))  # NaN stays NaN
        return {key: rows.to(dtype)}

    def problem(self, key: str) -> str:
        return (f"a captured value of {key} lies beyond float16's range (+-65504) and would be "
                "stored as an infinity; use output.dtype=float32, or bfloat16")


class Float8(Encoding):
    """e4m3 bytes and a float32 scale per row (per ``scaled_axes`` trailing axes): scale =
    max|row| / 448 (1.0 for a row of zeros; 2^-149 where that underflows to 0), byte =
    (row / scale) as e4m3. A NaN or an infinity in a row would make its scale, and so every
    value of the row, NaN: refused."""

    dtype = torch.float8_e4m3fn
    compact = True

    def encode(self, key: str, rows: torch.Tensor, scaled_axes: int) -> dict[str, torch.Tensor]:
        rows = rows.float()
        axes = tuple(range(rows.dim() - scaled_axes, rows.dim()))
        largest = rows.abs().amax(axes, keepdim=True) if axes else rows.abs()
        self._flags.append((key, ~torch.isfinite(largest).all()))
        scale = largest / FLOAT8_MAX
        # a row of zeros is scaled by 1; one so small that its scale underflows to 0 (below
        # about 6e-43) by float32's smallest value, not 0, which would make its zeros NaN
        scale = torch.where(largest == 0, 1.0, torch.where(scale == 0, _SMALLEST, scale))
        data = (rows / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        return {key: data, scale_key(key): scale.reshape(scale.shape[:rows.dim() - scaled_axes])}

    def decode(self, key: str, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        values = decode_float8(parts[key].numpy(), parts[scale_key(key)].numpy())
        return torch.from_numpy(values)

    def specs(self, key: str, spec: DatasetSpec, scaled_axes: int) -> dict[str, DatasetSpec]:
        kept = len(spec.row_shape) - scaled_axes  # the row's axes that each have a scale
        dims = spec.attrs.get(Attr.DIMS)
        scale = DatasetSpec(spec.row_shape[:kept], "float32",
                            {Attr.SCALE_OF: split_key(key)[1],
                             **({Attr.DIMS: list(dims)[:1 + kept]} if dims else {})},
                            per_position=spec.per_position, bounds=spec.bounds)
        own = replace(spec, attrs={**spec.attrs, Attr.DTYPE: FLOAT8,
                                   Attr.ENCODING: f"{FLOAT8}: value = decode_table[byte] * "
                                                  "scale",
                                   Attr.SCALE: split_key(scale_key(key))[1],
                                   Attr.SCALED_AXES: scaled_axes,
                                   Attr.DECODE_TABLE: float8_table()})
        return {key: own, scale_key(key): scale}

    def problem(self, key: str) -> str:
        return (f"a captured value of {key} is NaN or infinite: output.dtype=float8 stores one "
                "scale per row, and that row would read back as NaN throughout; use "
                "output.dtype=float32 (or bfloat16) to keep such values as they are")


def encoding_for(dtype: torch.dtype | None) -> Encoding:
    """The encoding of rows stored as ``dtype`` (None: as captured)."""
    return Float8() if dtype == torch.float8_e4m3fn else Cast(dtype)


assert np.float32(FLOAT8_MAX) == float8_table()[0x7E]  # the largest finite e4m3 value
