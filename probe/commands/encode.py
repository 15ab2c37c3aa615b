"""``python -m probe.encode file=PATH targets=T.npy``: a cross-validated ridge encoding model per
stored key (probe.analyses.encode); prints the scores, writes encoding.csv, scores.h5 and
encoding.png."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.config.checks import required

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _encode(cfg: DictConfig) -> None:
    from probe.analyses.encode import default_out_dir, encode, format_table, write_results
    from probe.analyses.plots import can_plot, plot_encoding
    from probe.analyses.tables import check_writable

    file = required(cfg.file, "file")
    targets = cfg.targets if cfg.repeats is not None else required(
        cfg.targets, "targets", "T.npy (one row per dataset sample) or targets=T.h5:NAME, or "
                                "repeats=R.npy to predict their mean")
    out_dir = check_writable(cfg.out_dir or default_out_dir(file), overwrite=cfg.overwrite)
    alphas = [float(a) for a in cfg.alphas]
    results = encode(file, targets, cfg["keys"], folds=cfg.folds, alphas=alphas,
                     max_features=cfg.max_features, seed=cfg.seed, device=cfg.device,
                     memory_mb=cfg.memory_mb, solver=cfg.solver,
                     delays=None if cfg.delays is None else list(cfg.delays), tr=cfg.tr,
                     onsets=cfg.onsets, runs=cfg.runs, hrf=cfg.hrf, repeats=cfg.repeats,
                     bands=None if cfg.bands is None else list(cfg.bands))
    written = write_results(results, out_dir, file=file, targets=targets or cfg.repeats,
                            folds=cfg.folds, alphas=alphas, seed=cfg.seed)
    if cfg.plot and can_plot("encoding.png"):
        written.append(plot_encoding(results, out_dir / "encoding.png",
                                     title=f"{Path(file).name}: {targets}"))
    print(format_table(results))
    for path in written:
        log.info("wrote %s", path)


def main() -> None:
    """``python -m probe.encode file=PATH targets=T``: fit the encoding models, write them."""
    from probe.analyses.encode.config import EncodeConfig

    hydra_command("encode", "python -m probe.encode", schema=EncodeConfig)(_encode)()
