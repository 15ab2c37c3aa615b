"""``python -m probe.gradcam file=PATH layer=NAME``: Grad-CAM maps of a conv layer
(probe.analyses.gradcam) into a new file, and a PNG montage of the first few."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command
from probe.config.checks import required
from probe.errors import ConfigError

__all__ = ["main"]

log = logging.getLogger(__name__)


@exit_on_user_error
def _gradcam(cfg: DictConfig) -> None:
    from probe.analyses.gradcam import save_montage, write_gradcam

    file = required(cfg.file, "file", "PATH, the .h5 file a probe run wrote with "
                                      "'hooks=[forward,backward]'")
    if int(cfg.num_images) < 0:
        raise ConfigError(f"num_images={cfg.num_images} must be 0 (no PNG) or more")
    written = write_gradcam(file, cfg.layer, cfg.output, cfg.normalize, cfg.block_rows,
                            overwrite=cfg.overwrite)
    if int(cfg.num_images) > 0:
        log.info("wrote %s", save_montage(written, int(cfg.num_images)))


def main() -> None:
    """``python -m probe.gradcam file=PATH layer=NAME``: store the maps, draw a montage."""
    from probe.analyses.gradcam.config import GradcamConfig

    hydra_command("gradcam", "python -m probe.gradcam", schema=GradcamConfig)(_gradcam)()
