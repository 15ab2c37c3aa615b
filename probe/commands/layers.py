"""``python -m probe.layers model=...``: every module of the model, with the shape it stores for
one sample and the bytes it adds to a file (probe.pipeline.listing). Writes nothing, not even a
run folder."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command

__all__ = ["main"]


@exit_on_user_error
def _list_layers(cfg: DictConfig) -> None:
    from probe.pipeline.listing import layer_table

    notes, rows = layer_table(cfg)
    for line in notes:
        print(line)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def main() -> None:
    """``python -m probe.layers``: list the model's modules; writes no run folder."""
    sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                 "hydra/hydra_logging=none"]
    hydra_command("config", "python -m probe.layers")(_list_layers)()
