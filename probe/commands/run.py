"""``python -m probe``: compose the config with Hydra and run the pipeline (probe.runner.run)."""

from __future__ import annotations

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command

__all__ = ["main"]


@exit_on_user_error
def _run(cfg: DictConfig) -> None:
    from probe.runner import run

    run(cfg)


def main() -> None:
    """``python -m probe``: run the pipeline."""
    hydra_command("config")(_run)()
