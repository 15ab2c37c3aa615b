"""``python -m probe.fit file=PATH``: fit the linear probes (probe.analyses.fit), print the
table, write probes.csv, probes.json and accuracy.png."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.config.checks import required

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _fit(cfg: DictConfig) -> None:
    from probe.analyses.fit import default_out_dir, fit_probes, format_table, write_table
    from probe.analyses.plots import can_plot, plot_accuracy
    from probe.analyses.tables import check_writable

    file = required(cfg.file, "file")
    out_dir = check_writable(cfg.out_dir or default_out_dir(file), overwrite=cfg.overwrite)
    results = fit_probes(file, cfg["keys"], test_fraction=cfg.test_fraction, folds=cfg.folds,
                         seed=cfg.seed, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                         weight_decay=cfg.weight_decay, device=cfg.device)
    written = write_table(results, out_dir)
    if cfg.plot and can_plot("accuracy.png"):
        written.append(plot_accuracy(results, out_dir / "accuracy.png", title=Path(file).name))
    print(format_table(results))
    for path in written:
        log.info("wrote %s", path)


def main() -> None:
    """``python -m probe.fit file=PATH``: fit the probes, write the table and the plot."""
    from probe.analyses.fit.config import FitConfig

    hydra_command("fit", "python -m probe.fit", schema=FitConfig)(_fit)()
