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
    # cka (linear CKA), cka_debiased (the unbiased HSIC estimator) or rsa (RDMs, Spearman);
    # null: rsa against rdm= or responses=, else cka
    metric: str | None = None
    # instead of `other`, a brain: its RDMs, a .npy or F.h5:name of (N, N), (S, N, N) for S
    # subjects (gives the noise ceiling), or condensed (N(N-1)/2,) or (S, N(N-1)/2)
    rdm: str | None = None
    # instead of `rdm`, the responses to make them from: (N, F) or (S, N, F), 1 - Pearson r
    responses: str | None = None
    # the dataset sample of each of the brain's N stimuli (a .npy of N integers); null: dataset
    # order, stimulus i is sample i
    index: str | None = None
    # draw the stimuli (cka: the rows) this many times (seeded) for a 95% interval of every value
    bootstrap: int = 0
    # where similarity.csv, the heatmap and the RDMs go; null: <file's folder>/<file stem>_compare
    out_dir: str | None = None
    # replace the findings an out_dir holds already (otherwise such a folder is refused)
    overwrite: bool = False
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
    # pair the rows of two files made from different datasets by /index all the same (their
    # data fingerprints differ: say that their indices name the same samples); noted in
    # compared.json
    pair_anyway: bool = False
    # also draw similarity.png (needs matplotlib)
    plot: bool = True
