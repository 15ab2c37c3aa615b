"""A batch computed under interventions: the run's own pass (a forward, a generation), with the
interventions' hooks on while it computes the batch (``Intervened``, a ``Pass``). It counts
where they applied, for the run's last log line."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from probe.data.feed import Batch, ModelLimits
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.file.format import DatasetSpec
from probe.pipeline.batch_rows import Computed
from probe.pipeline.interventions.apply import Interventions

__all__ = ["Intervened"]


@dataclass
class Intervened:
    """``inner``, with ``interventions`` on for each batch it computes."""

    inner: object  # the run's own Pass (probe.pipeline.passes)
    interventions: Interventions
    applied: list[int] = field(default_factory=list)  # each intervention's, over the run

    def __call__(self, batch: Batch) -> Computed:
        with self.interventions.on(batch) as applied:
            computed = self.inner(batch)
        self.applied = [a + b for a, b in zip(self.applied or [0] * len(applied), applied,
                                              strict=True)]
        return computed

    def rehearse(self, batch: Batch) -> None:
        with self.interventions.rehearsing(batch):
            self.inner.rehearse(batch)

    def rows(self, layout: RowLayout) -> RowLayout:
        return self.inner.rows(layout)

    def bookkeeping(self) -> dict[str, DatasetSpec]:
        return self.inner.bookkeeping()

    def positions(self, stored: np.ndarray | None) -> tuple[np.ndarray | None, bool]:
        # positions listed by number must lie in every prompt: said before the run, where the
        # feed counts them (a sample's stored positions; the run checks each batch again)
        for change in self.interventions.changes:
            _require_as_many_samples(change, stored)
            listed = change.positions
            if stored is None or isinstance(listed, str) or not len(stored):
                continue
            shortest = int(np.min(stored))
            outside = [p for p in listed if not -shortest <= p < shortest]
            if outside:
                raise ConfigError(f"{change.where}: positions={list(listed)} lies beyond the "
                                  f"shortest sample, of {shortest} positions; use positions "
                                  "that every sample has (negative ones count from the end)")
        return self.inner.positions(stored)

    def limits(self, limits: ModelLimits) -> ModelLimits:
        return self.inner.limits(limits)

    def summary(self) -> str | None:
        inner = self.inner.summary()
        said = "; ".join(f"{change.label}: {count}" for change, count in
                         zip(self.interventions.changes, self.applied, strict=False))
        mine = f"interventions applied at (positions, or samples) {said}" if said else None
        return "; ".join(s for s in (inner, mine) if s) or None


def _require_as_many_samples(change, stored: np.ndarray | None) -> None:
    # a patch source of fewer samples than the run takes lacks one of them: said before the
    # run (which samples it lacks, where it holds as many, each batch finds as it reads them)
    held = None if change.patch is None else change.patch.samples
    if stored is not None and held is not None and held < len(stored):
        raise ConfigError(f"{change.where}: {change.patch.path!r} holds {held} samples and "
                          f"this run takes {len(stored)}; patch from a run over the same "
                          "samples (the same limit, subset and shard)")
