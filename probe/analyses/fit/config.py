"""The config schema of ``python -m probe.fit``, whose values are in conf/fit.yaml
(probe.config.compose registers it as ``fit_schema``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FitConfig"]


@dataclass
class FitConfig:
    # the probe file to read (a finished run with `target`); required
    file: str | None = None
    # "<layer>/<kind>" or "<layer>" (all its kinds) to fit; null: every stored dataset
    keys: list[str] | None = None
    # where the table and plot go; null: <file's folder>/<file stem>_fit
    out_dir: str | None = None
    # replace the findings an out_dir holds already (otherwise such a folder is refused)
    overwrite: bool = False
    # share of the rows held out for testing; ignored when `folds` is set
    test_fraction: float = 0.25
    # k-fold cross-validation instead of one held-out split (every row is tested once)
    folds: int | None = None
    # fixes the split, the shuffles and therefore the accuracies
    seed: int = 0
    # passes of Adam over the training rows, in mini-batches streamed from the file
    epochs: int = 30
    batch_size: int = 256
    lr: float = 0.01
    # L2 penalty on the weights (Adam's weight_decay)
    weight_decay: float = 0.0001
    # cpu | cuda | cuda:N | mps | auto
    device: str = "cpu"
    # also draw accuracy.png (needs matplotlib)
    plot: bool = True
