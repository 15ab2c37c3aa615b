"""A run's compact storage, decided before its first row (probe.pipeline.plan asks here): the
encoding of output.dtype, each projected key's projection (drawn, fitted on a pass over the
fit samples, or read back from the file a resumed run continues), and the fidelity report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping

import torch

from probe.config.schema import ProbeConfig, Reduce
from probe.errors import ConfigError
from probe.pipeline.compact import Compact
from probe.pipeline.compact.encodings import encoding_for
from probe.pipeline.compact.fidelity import Fidelity
from probe.pipeline.compact.fit import PcaFit, draw_srp
from probe.pipeline.compact.projections import Projection
from probe.pipeline.keys import KeyTransform

__all__ = ["check_compact", "compact_for"]

log = logging.getLogger(__name__)

MOST_FIDELITY_ROWS = 8192  # the report's CKA holds two n x n float64 matrices: 1 GiB at this
# the rows of each fit batch by key, and the samples they come from
FitRows = Callable[[], Iterator[tuple[Mapping[str, torch.Tensor], int]]]


def check_compact(config: ProbeConfig) -> None:
    """Refuse settings of compact storage that cannot work, before anything is computed.

    Raises:
        ConfigError: one line, naming the value and the fix.
    """
    projects = config.reduce.projects or any(
        str(how) in ("pca", "srp") for how in (config.reduce_by_layer or {}).values())
    if projects and config.reduce_components is None:
        raise ConfigError("reduce=pca|srp projects each row on reduce_components values; set "
                          "it, e.g. reduce_components=64")
    if config.reduce_components is not None and config.reduce_components < 1:
        raise ConfigError(f"reduce_components={config.reduce_components} must be at least 1")
    if config.reduce_fit_samples < 1:
        raise ConfigError(f"reduce_fit_samples={config.reduce_fit_samples}: pca fits its axes "
                          "on the rows of at least 1 sample; use 1 or more (default 256)")
    if not 0 <= config.output.fidelity_rows <= MOST_FIDELITY_ROWS:
        raise ConfigError(f"output.fidelity_rows={config.output.fidelity_rows}: use 0 (no "
                          f"report) to {MOST_FIDELITY_ROWS} (its CKA holds an n x n matrix)")


def compact_for(config: ProbeConfig, transforms: Mapping[str, KeyTransform], *,
                stored: Mapping[str, dict], fit_rows: FitRows) -> Compact:
    """What each key's datasets store: ``stored`` holds the projections of the file a run
    resumes (never fitted again); ``fit_rows`` computes the fit samples' rows for pca.

    Raises:
        ConfigError: too few fit rows for the components.
    """
    projections: dict[str, Projection] = {}
    fits: dict[str, PcaFit] = {}
    for key, transform in transforms.items():
        if not transform.reduce.projects:
            continue
        components = transform.row_shape[0]
        if key in stored:
            projections[key] = Projection.from_stored(stored[key])
        elif transform.reduce is Reduce.srp:
            projections[key] = draw_srp(key, transform.width, components, config.seed)
        else:
            fits[key] = PcaFit(key, transform.width, components)
    if fits:
        projections.update(_fit(fits, fit_rows))
    rows = config.output.fidelity_rows
    return Compact(encoding_for(config.output.dtype.torch), projections=projections,
                   scaled_axes={key: t.scaled_axes for key, t in transforms.items()},
                   fidelity=Fidelity(rows) if rows else None)


def _fit(fits: dict[str, PcaFit], fit_rows: FitRows) -> dict[str, Projection]:
    started = time.perf_counter()
    for rows, samples in fit_rows():
        for key, fit in fits.items():
            fit.add(rows[key], samples)
    fitted = {key: fit.projection() for key, fit in fits.items()}
    for key, projection in fitted.items():
        attrs = projection.attrs
        log.info("reduce=pca: %s fitted on %d rows of %d samples in %.1f s; its %d components "
                 "keep %.1f%% of the rows' variance", key, attrs["fit_rows"], attrs["fit_samples"],
                 time.perf_counter() - started, len(projection.components),
                 100 * attrs["explained_variance_ratio"])
    return fitted
