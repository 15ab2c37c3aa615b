"""``python -m probe.encode file=PATH targets=T.npy``: a cross-validated ridge encoding model per
stored key (probe.analyses.encode); prints the scores, writes encoding.csv, scores.h5 and
encoding.png."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.commands.compare import have_matplotlib, listed
from probe.commands.fit import _check_writable
from probe.errors import ConfigError

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _encode(cfg: DictConfig) -> None:
    from probe.analyses.encode import default_out_dir, encode, format_table, write_results

    if cfg.file is None:
        raise ConfigError("file is not set; pass file=PATH, the .h5 file a probe run wrote")
    if cfg.targets is None:
        raise ConfigError("targets is not set; pass targets=T.npy (one row per dataset "
                          "sample) or targets=T.h5:NAME")
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.file)
    _check_writable(out_dir)
    alphas = [float(a) for a in cfg.alphas]
    results = encode(cfg.file, cfg.targets, listed(cfg["keys"]), folds=cfg.folds,
                     alphas=alphas, max_features=cfg.max_features, seed=cfg.seed,
                     device=cfg.device, memory_mb=cfg.memory_mb, solver=cfg.solver)
    written = write_results(results, out_dir, file=cfg.file, targets=cfg.targets,
                            folds=cfg.folds, alphas=alphas, seed=cfg.seed)
    if cfg.plot and have_matplotlib():
        from probe.analyses.plots import plot_encoding

        written.append(plot_encoding(results, out_dir / "encoding.png",
                                     title=f"{Path(cfg.file).name}: {cfg.targets}"))
    elif cfg.plot:
        log.warning("matplotlib is not installed, so no encoding.png: pip install "
                    "'probe[viz]' (or pass plot=false)")
    print(format_table(results))
    for path in written:
        log.info("wrote %s", path)


def main() -> None:
    """``python -m probe.encode file=PATH targets=T``: fit the encoding models, write them."""
    from probe.analyses.encode.config import EncodeConfig

    hydra_command("encode", "python -m probe.encode", schema=EncodeConfig)(_encode)()
