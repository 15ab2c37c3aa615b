"""The config schema of ``python -m probe.compare``, whose values are in conf/compare.yaml
(probe.config.compose registers it as ``compare_schema``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompareConfig"]


@dataclass
class CompareConfig:
    # the probe file to read (a finished run); required
    file: str | None = None
    # a second file to compare with, rows matched by /index; null: the keys of `file` pairwise
    other: str | None = None
    # "<layer>/<kind>" or "<layer>" (all its kinds) of `file`; null: every stored dataset
    keys: list[str] | None = None
    # the same for `other`; null: the names of `keys` (every stored dataset when keys is null)
    other_keys: list[str] | None = None
    # cka (linear CKA), cka_debiased (the unbiased HSIC estimator) or rsa (RDMs, Spearman)
    metric: str = "cka"
    # where similarity.csv, the heatmap and the RDMs go; null: <file's folder>/<file stem>_compare
    out_dir: str | None = None
    # rsa: an RDM is N x N, so it is made of at most this many samples (a seeded subset)
    rdm_samples: int | None = 2000
    # rsa: also write the RDMs to <out_dir>/rdms.h5 (for rsatoolbox)
    save_rdms: bool = False
    # seeds the rdm_samples subset
    seed: int = 0
    # cpu | cuda | cuda:N | mps | auto: where the sums are made (float64)
    device: str = "cpu"
    # MiB for the blocks of rows and the sums held at once; the file may be any larger
    memory_mb: float = 2048
    # cka: auto | features (D x D sums per key) | gram (N x N Gram blocks); auto picks by width
    accumulate: str = "auto"
    # also draw similarity.png (needs matplotlib)
    plot: bool = True
