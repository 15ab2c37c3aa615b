"""``python -m probe.fit file=PATH``: fit the linear probes (probe.analyses.fit), print the
table, write probes.csv, probes.json and accuracy.png."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.errors import ConfigError, OutputError

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _fit(cfg: DictConfig) -> None:
    from probe.analyses.fit import default_out_dir, fit_probes, format_table, write_table

    if cfg.file is None:
        raise ConfigError("file is not set; pass file=PATH, the .h5 file a probe run wrote")
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.file)
    _check_writable(out_dir)
    results = fit_probes(cfg.file, None if cfg["keys"] is None else list(cfg["keys"]),
                         test_fraction=cfg.test_fraction, folds=cfg.folds, seed=cfg.seed,
                         epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                         weight_decay=cfg.weight_decay, device=cfg.device)
    written = write_table(results, out_dir)
    if cfg.plot:
        from probe.analyses.plots import plot_accuracy

        written.append(plot_accuracy(results, out_dir / "accuracy.png", title=Path(cfg.file).name))
    print(format_table(results))
    for path in written:
        log.info("wrote %s", path)


def _check_writable(out_dir: Path) -> None:
    # fail before the fitting, without creating anything yet
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write to out_dir={str(out_dir)!r} ({str(existing)!r} is not "
                          "a writable folder); choose a writable out_dir")


def main() -> None:
    """``python -m probe.fit file=PATH``: fit the probes, write the table and the plot."""
    from probe.analyses.fit.config import FitConfig

    hydra_command("fit", "python -m probe.fit", schema=FitConfig)(_fit)()
