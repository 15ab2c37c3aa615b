"""``python -m probe.compare file=PATH [other=PATH]``: the similarity of every pair of stored
keys (probe.analyses.compare); prints the matrix, writes similarity.csv, similarity.png and,
asked, rdms.h5."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.config.checks import required
from probe.errors import ConfigError

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _compare(cfg: DictConfig) -> None:
    from probe.analyses.compare import compare, default_out_dir, format_table, write_similarity
    from probe.analyses.plots import can_plot, plot_similarity
    from probe.analyses.tables import check_writable

    file = required(cfg.file, "file")
    brain = cfg.rdm is not None or cfg.responses is not None
    metric = cfg.metric or ("rsa" if brain else "cka")
    if cfg.save_rdms and metric != "rsa":
        raise ConfigError(f"save_rdms=true saves the RDMs of metric=rsa, not of "
                          f"metric={metric}; add metric=rsa, or leave save_rdms out")
    out_dir = check_writable(cfg.out_dir or default_out_dir(file), overwrite=cfg.overwrite)
    result = compare(file, cfg.other, cfg["keys"], cfg.other_keys, cfg.metric,
                     rdm_samples=cfg.rdm_samples,
                     rdms=out_dir / "rdms.h5" if cfg.save_rdms else None, seed=cfg.seed,
                     rdm=cfg.rdm, responses=cfg.responses, index=cfg.index,
                     bootstrap=cfg.bootstrap,
                     device=cfg.device, memory_mb=cfg.memory_mb, accumulate=cfg.accumulate,
                     pair_anyway=cfg.pair_anyway)
    written = [write_similarity(result, out_dir)]
    if "rdms" in result.notes:
        written.append(Path(result.notes["rdms"]))
    if cfg.plot and can_plot("similarity.png"):
        title = result.file.name + ("" if result.other is None else f" vs {result.other.name}")
        written.append(plot_similarity(result.matrix(), result.keys_a, result.keys_b,
                                       out_dir / "similarity.png", label=result.metric,
                                       title=title))
    print(format_table(result))
    for path in written:
        log.info("wrote %s", path)


def main() -> None:
    """``python -m probe.compare file=PATH``: compare the keys, write the table and heatmap."""
    from probe.analyses.compare.config import CompareConfig

    hydra_command("compare", "python -m probe.compare", schema=CompareConfig)(_compare)()
