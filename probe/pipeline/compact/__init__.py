"""Compact storage at capture: each key's rows projected (reduce=pca|srp: probe.pipeline.compact
.projections), then encoded (output.dtype: a cast, or float8 with a scale per row:
.encodings), and what that lost measured on the first rows (output.fidelity_rows: .fidelity).

    compact = Compact(encoding_for(dtype), projections={key: Projection}, scaled_axes={...},
                      fidelity=Fidelity(256))
    parts = compact.encode(key, rows)     # the datasets' values of one batch of ``key``
    compact.specs(key, spec)              # the datasets that hold ``key``
    compact.report()                      # {key: fidelity attrs}

The hook object hands each key's rows here (probe.pipeline.batch_rows); the plan builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from probe.file.format import DatasetSpec
from probe.pipeline.compact.encodings import Cast, Encoding, Float8, encoding_for
from probe.pipeline.compact.fidelity import Fidelity, unmeasured
from probe.pipeline.compact.projections import Projection

__all__ = ["Compact", "Encoding", "Cast", "Float8", "encoding_for", "Fidelity", "Projection"]


class Compact:
    """How each key's rows are stored (see the module's docstring). ``scaled_axes``: the
    trailing axes of a row that one float8 scale covers, by key (default: all of them)."""

    def __init__(self, encoding: Encoding, *, projections: Mapping[str, Projection] | None = None,
                 scaled_axes: Mapping[str, int] | None = None,
                 fidelity: Fidelity | None = None):
        self.encoding = encoding
        self.projections = dict(projections or {})
        self._scaled_axes = dict(scaled_axes or {})
        self.fidelity = fidelity

    def scaled_axes(self, key: str, rows: torch.Tensor) -> int:
        return self._scaled_axes.get(key, rows.dim() - 1)

    def encode(self, key: str, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The values ``key``'s datasets get of ``rows`` (one batch's, first axis the rows), on
        the rows' device."""
        projection = self.projections.get(key)
        stored = rows if projection is None else projection(rows)
        parts = self.encoding.encode(key, stored, self.scaled_axes(key, stored))
        if self.fidelity is not None and (projection or self.encoding.compact):
            self._observe(key, rows, parts, projection)
        return parts

    def _observe(self, key: str, rows: torch.Tensor, parts: dict, projection) -> None:
        wanted = min(self.fidelity.wants(key), len(rows))
        if wanted <= 0:
            return
        kept = {name: part[:wanted].cpu() for name, part in parts.items()}
        stored = self.encoding.decode(key, kept)
        restored = stored if projection is None else projection.inverse(stored)
        extra = {} if projection is None else projection.fidelity_attrs()
        self.fidelity.keep(key, rows[:wanted].float().cpu(), stored, restored, **extra)

    def check(self) -> None:
        """Refuse a value the encoding could not hold (ConfigError)."""
        self.encoding.check()

    def specs(self, key: str, spec: DatasetSpec) -> dict[str, DatasetSpec]:
        """The datasets that hold ``key``, whose rows ``spec`` describes."""
        scaled = self._scaled_axes.get(key, len(spec.row_shape))
        projection = self.projections.get(key)
        if self.fidelity is not None and (projection is not None or self.encoding.compact):
            # made now, filled in at the end: a file open for SWMR writing takes no new attrs
            spec = replace(spec, attrs={**spec.attrs, **unmeasured(projection is not None and
                                                                    projection.method == "pca")})
        return self.encoding.specs(key, spec, scaled)

    def report(self) -> dict[str, dict]:
        """Each compact key's fidelity attrs ({} without a fidelity report)."""
        return {} if self.fidelity is None else self.fidelity.report()
