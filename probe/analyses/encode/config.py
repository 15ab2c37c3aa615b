"""The config schema of ``python -m probe.encode``, whose values are in conf/encode.yaml
(probe.config.compose registers it as ``encode_schema``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EncodeConfig", "ALPHAS"]

# the ridge penalties searched by default: 0.1 to 1e8, in the units of the summed squares
# XcᵀXc (as scikit-learn's and himalaya's Ridge take them)
ALPHAS = [0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8]


@dataclass
class EncodeConfig:
    # the probe file to read (a finished run); required
    file: str | None = None
    # what to predict: T.npy (N, V) or T.h5:name, row i belonging to dataset sample i (TR i,
    # with tr); required unless repeats gives them
    targets: str | None = None
    # "<layer>/<kind>" or "<layer>" (all its kinds); null: every stored dataset
    keys: list[str] | None = None
    # outer cross-validation folds; for each, alpha is chosen by an inner search over the others
    folds: int = 5
    # ridge penalties to choose from, for each target column on its own
    alphas: list[float] = field(default_factory=lambda: list(ALPHAS))
    # wider rows are first reduced to this many features by a seeded sparse random projection
    max_features: int = 4096
    # where encoding.csv, scores.h5 and the plot go; null: <file's folder>/<file stem>_encode
    out_dir: str | None = None
    # replace the findings an out_dir holds already (otherwise such a folder is refused)
    overwrite: bool = False
    # fixes the folds and the projection
    seed: int = 0
    # cpu | cuda | cuda:N | auto: where the ridge is solved (float64)
    device: str = "cpu"
    # MiB for the rows and sums held at once; decides whether a key's rows are loaded
    memory_mb: float = 2048
    # auto (exact, by cost: streamed sums when features <= training rows, else the kernel
    # form where its rows x rows Gram matrix fits) | streamed | kernel | himalaya (RidgeCV)
    solver: str = "auto"
    # naturalistic designs (movies, stories): a finite impulse response, each row beside the
    # rows that many rows (TRs) before it, e.g. [1,2,3,4]; null: none. The rows are then a
    # time series, and the folds contiguous runs of it
    delays: list[int] | None = None
    # seconds per TR: the targets' rows are TRs, and the rows are averaged into them by their
    # time (the file's /onset, or onsets); null: row i of the targets is dataset sample i
    tr: float | None = None
    # O.npy: each dataset sample's onset in seconds (frames follow at the file's frame rate),
    # or one per stored row (tokens with their word onsets); with tr; null: the file's /onset
    onsets: str | None = None
    # R.npy: each targets row's run (one per stimulus file, its TRs consecutive): 0 .. F-1 in
    # the order the files first appear in the dataset, or their /file names; with tr; null:
    # one run (a file of rows of several files needs it)
    runs: str | None = None
    # spm | glover: convolve each run's TRs with nilearn's haemodynamic response (before any
    # delays); with tr; null: none
    hrf: str | None = None
    # R.npy (R, N, V): repeated responses, for each target's noise ceiling (split-half,
    # Spearman-Brown) and the scores normalised by it; targets default to their mean
    repeats: str | None = None
    # two or more keys for one more model, a banded ridge across them (each key a band with a
    # penalty of its own: himalaya's multiple-kernel ridge), e.g. [layer3,layer4]; null: none
    bands: list[str] | None = None
    # also draw encoding.png (needs matplotlib)
    plot: bool = True
