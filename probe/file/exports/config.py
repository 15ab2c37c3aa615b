"""The config schema of ``python -m probe.export``, whose values are in conf/export.yaml
(probe.config.compose registers it as ``export_schema``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ExportConfig"]


@dataclass
class ExportConfig:
    # the probe file to export (a finished run); required
    file: str | None = None
    # npy | parquet | mat | saelens | speculators: what the next tool reads
    to: str | None = None
    # "<layer>/<kind>" or "<layer>" (all its kinds); null: every stored key (saelens: every
    # key with a row per token)
    keys: list[str] | None = None
    # the folder to write; null: <file's folder>/<file stem>_export
    out_dir: str | None = None
    # saelens: seeds the shuffle of the contexts; null keeps them in file order
    seed: int | None = 0
    # saelens: a column name for a layer or key, as the trainer names its hook
    # ('names={transformer.h.6:blocks.6.hook_resid_post}'); others are named by the layer
    # (typed Any: Hydra cannot merge new keys into a typed dict, nor a dict into a null one)
    names: Any = None
    # replace an out_dir that is not empty (only once the new one is written in full)
    overwrite: bool = False
    # MiB of rows held at once; the file may be any larger
    memory_mb: float = 256
    # speculators: the auxiliary layer ids, as speculators and vLLM count them (id i: the output
    # of block i - 1); null: EAGLE-3's [2, L // 2, L - 3] of the model's L blocks
    aux: list[int] | None = None
