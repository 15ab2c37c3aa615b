"""What compact storage lost, measured on the first rows of each key: the rows as computed in
float32 against what a reader gets back from the file (decoded; mapped back through a
projection's inverse), and the compact rows themselves against the float32 ones.

    fidelity_rows                  rows compared (the first this run stored, per key)
    fidelity_mean_relative_error   mean over rows of |x - x̂| / |x| (rows of zeros left out)
    fidelity_max_relative_error    its worst row
    fidelity_min_cosine            the worst row's cosine between x and x̂
    fidelity_cka                   linear CKA between the float32 rows and the stored ones
    fidelity_explained_variance    pca: the fit rows' variance its components keep
"""

from __future__ import annotations

import torch

from probe.file.format import Attr

__all__ = ["Fidelity", "measure", "linear_cka", "unmeasured"]


def unmeasured(pca: bool) -> dict:
    """The fidelity attrs of rows not yet measured (a run that has not finished): 0 rows,
    NaN for each figure."""
    names = [name for name in Attr.FIDELITY if pca or name != "fidelity_explained_variance"]
    return {Attr.FIDELITY_ROWS: 0, **dict.fromkeys(names, float("nan"))}


class Fidelity:
    """The first ``rows`` rows of each key, as computed and as stored (see the module)."""

    def __init__(self, rows: int):
        self.rows = rows
        self._kept: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._count: dict[str, int] = {}
        self._extra: dict[str, dict] = {}

    def wants(self, key: str) -> int:
        """How many more rows of ``key`` it keeps."""
        return self.rows - self._count.get(key, 0)

    def keep(self, key: str, computed: torch.Tensor, stored: torch.Tensor,
             restored: torch.Tensor, **extra) -> None:
        """Rows of ``key`` (on the CPU): as ``computed`` (float32), as ``stored`` (the compact
        rows, decoded) and as ``restored`` from them (the computed rows' estimate)."""
        self._kept.setdefault(key, []).append((computed, stored, restored))
        self._count[key] = self._count.get(key, 0) + len(computed)
        self._extra[key] = extra

    def report(self) -> dict[str, dict]:
        """Each key's fidelity attrs (see the module's docstring)."""
        report = {}
        for key, parts in self._kept.items():
            computed, stored, restored = (torch.cat(p)[:self.rows] for p in zip(*parts,
                                                                                 strict=True))
            report[key] = {**measure(computed, stored, restored), **self._extra[key]}
        return report


def measure(computed: torch.Tensor, stored: torch.Tensor, restored: torch.Tensor) -> dict:
    """The fidelity attrs of rows (first axis) ``computed``, ``stored`` and ``restored``."""
    x = computed.flatten(1).double()
    x_hat = restored.flatten(1).double()
    norms = x.norm(dim=1)
    real = norms > 0
    error = (x - x_hat).norm(dim=1)[real] / norms[real]
    cosine = torch.nn.functional.cosine_similarity(x[real], x_hat[real], dim=1, eps=1e-300)
    return {"fidelity_rows": len(x),  # rows of zeros alone: nothing relative to measure, 0
            "fidelity_mean_relative_error": _number(error.mean()) if len(error) else 0.0,
            "fidelity_max_relative_error": _number(error.max()) if len(error) else 0.0,
            "fidelity_min_cosine": _number(cosine.min()) if len(cosine) else 1.0,
            "fidelity_cka": linear_cka(x, stored.flatten(1).double())}


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two sets of rows (Kornblith et al. 2019), by their n x n Gram matrices:
    <K, L> / (|K| |L|) with K, L of the centred rows (any widths)."""
    x, y = x - x.mean(0), y - y.mean(0)
    k, l_ = x @ x.T, y @ y.T
    denominator = k.norm() * l_.norm()
    return _number((k * l_).sum() / denominator) if denominator > 0 else 1.0


def _number(value: torch.Tensor) -> float:
    return float(value)
