"""``python -m probe``: compose the config with Hydra and run the pipeline
(probe.pipeline.execute.run).

A run that fails leaves no run folder behind when it made that folder itself
(probe.commands.folders), and its error is logged to a kept folder's ``probe.log`` too.
Started by torchrun, each process runs one rank (probe.commands.ranks).
"""

from __future__ import annotations

import logging
import sys

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.commands import ranks as torchrun
from probe.commands.flags import refuse_a_read_only_directory
from probe.commands.folders import without_a_trace

__all__ = ["main"]

log = logging.getLogger(__name__)


@without_a_trace  # outside: the error is logged (and printed) first
@exit_on_user_error
def _run(cfg: DictConfig) -> None:
    from probe.pipeline.execute import run

    ranks = torchrun.from_environment()
    if ranks is None:
        run(cfg)
    else:
        torchrun.run(cfg, ranks)


def main() -> None:
    """``python -m probe``: run the pipeline (one rank of it, when torchrun started it)."""
    refuse_a_read_only_directory(sys.argv[1:])
    ranks = torchrun.from_environment()
    if ranks is not None:
        sys.argv += torchrun.prepare(ranks, sys.argv[1:])
    hydra_command("config", "python -m probe")(_run)()
