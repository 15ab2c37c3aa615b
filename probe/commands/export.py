"""``python -m probe.export file=PATH to=npy|parquet|mat|saelens``: the stored keys in the format
the next tool reads (probe.file.exports); prints each file written, its rows and bytes."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from probe.commands import exit_on_user_error, hydra_command
from probe.config.checks import required

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _export(cfg: DictConfig) -> None:
    from probe.file.exports import ROUTES, export

    file = required(cfg.file, "file")
    to = required(cfg.to, "to", "|".join(ROUTES))
    keys, names = (OmegaConf.to_container(v) if OmegaConf.is_config(v) else v
                   for v in (cfg["keys"], cfg.names))
    aux = OmegaConf.to_container(cfg.aux) if OmegaConf.is_config(cfg.aux) else cfg.aux
    done = export(file, to, keys=keys, out_dir=cfg.out_dir, seed=cfg.seed, names=names,
                  overwrite=cfg.overwrite, memory_mb=cfg.memory_mb, aux=aux)
    for said in done.stored:  # compact rows, written decoded: how the file held them
        log.info("%s", said)
    for line in done.lines():
        print(line)


def main() -> None:
    """``python -m probe.export file=PATH to=ROUTE``: write the export, say what it wrote."""
    from probe.file.exports.config import ExportConfig

    hydra_command("export", "python -m probe.export", schema=ExportConfig)(_export)()
