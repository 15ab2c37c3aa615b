"""``python -m probe.compare file=PATH [other=PATH]``: the similarity of every pair of stored
keys (probe.analyses.compare); prints the matrix, writes similarity.csv, similarity.png and,
asked, rdms.h5."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.commands.fit import _check_writable
from probe.errors import ConfigError

__all__ = ["main", "have_matplotlib", "listed"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _compare(cfg: DictConfig) -> None:
    from probe.analyses.compare import compare, default_out_dir, format_table, write_similarity

    if cfg.file is None:
        raise ConfigError("file is not set; pass file=PATH, the .h5 file a probe run wrote")
    if cfg.save_rdms and cfg.metric != "rsa":
        raise ConfigError(f"save_rdms=true saves the RDMs of metric=rsa, not of "
                          f"metric={cfg.metric}; add metric=rsa, or leave save_rdms out")
    out_dir = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.file)
    _check_writable(out_dir)
    result = compare(cfg.file, cfg.other, listed(cfg["keys"]), listed(cfg.other_keys),
                     cfg.metric, rdm_samples=cfg.rdm_samples,
                     rdms=out_dir / "rdms.h5" if cfg.save_rdms else None, seed=cfg.seed,
                     device=cfg.device, memory_mb=cfg.memory_mb, accumulate=cfg.accumulate)
    written = [write_similarity(result, out_dir)]
    if "rdms" in result.notes:
        written.append(Path(result.notes["rdms"]))
    if cfg.plot and have_matplotlib():
        from probe.analyses.plots import plot_similarity

        title = result.file.name + ("" if result.other is None else f" vs {result.other.name}")
        written.append(plot_similarity(result.matrix(), result.keys_a, result.keys_b,
                                       out_dir / "similarity.png", label=result.metric,
                                       title=title))
    elif cfg.plot:
        log.warning("matplotlib is not installed, so no similarity.png: pip install "
                    "'probe[viz]' (or pass plot=false)")
    print(format_table(result))
    for path in written:
        log.info("wrote %s", path)


def have_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def listed(keys) -> list[str] | None:
    return None if keys is None else [str(key) for key in keys]


def main() -> None:
    """``python -m probe.compare file=PATH``: compare the keys, write the table and heatmap."""
    from probe.analyses.compare.config import CompareConfig

    hydra_command("compare", "python -m probe.compare", schema=CompareConfig)(_compare)()
