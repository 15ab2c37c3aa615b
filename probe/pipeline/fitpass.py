"""The pass before a run that reduce=pca's fit needs: the fit samples computed as the run will
compute them (its pass, its interventions, its hooks), each key's rows handed over in float32
before any projection, never written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from probe.pipeline.compact import Cast, Compact
from probe.pipeline.dryrun import DryRun
from probe.pipeline.hooks import Capture
from probe.pipeline.keys import KeyTransform
from probe.pipeline.modules import frozen_parameters

__all__ = ["fit_rows"]


def fit_rows(compute, capture: Capture, feed, dataset, selection, batching,
             device: torch.device, shown: DryRun, transforms: Mapping[str, KeyTransform]
             ) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
    """The rows (float32, on the CPU) of every key of each batch of ``selection``, and the
    samples each batch holds; the capture is armed for the pass (the plan arms it again)."""
    capture.arm(shown.calls, shown.where, transforms, Compact(Cast(torch.float32)))
    loader = feed.loader(dataset, selection, batching)
    with capture, frozen_parameters(capture.model, capture.needs_grad):
        for batch in loader:
            if not len(batch):  # every sample of it left out (dataset.on_error=skip)
                continue
            computed = compute(batch.to(device))
            for event in computed.ready or []:  # the copies from a GPU
                event.synchronize()
            yield {key: computed.rows[key] for key in transforms}, len(batch)
