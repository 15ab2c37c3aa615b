"""The config schema of ``python -m probe.gradcam``, whose values are in conf/gradcam.yaml
(probe.config.compose registers it as ``gradcam_schema``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GradcamConfig"]


@dataclass
class GradcamConfig:
    # the probe file to read: a finished run with hooks=[forward,backward] and reduce=none
    file: str | None = None
    # the conv layer whose output and grad_output make the maps; null: the only such layer
    layer: str | None = None
    # the HDF5 file to write; null: <file's folder>/<file stem>_gradcam.h5
    output: str | None = None
    # replace a file at output (otherwise it is refused: findings never replace findings unasked)
    overwrite: bool = False
    # scale each stored map to a maximum of 1 (a map that is all 0 stays 0)
    normalize: bool = False
    # samples in the montage PNG (<output stem>.png); 0: no PNG
    num_images: int = 8
    # rows computed at a time; null: whole HDF5 chunks adding up to about 64 MiB
    block_rows: int | None = None
