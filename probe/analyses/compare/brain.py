"""Brain data on the other side of RSA: RDMs given as arrays (one, or one per subject) or made
from responses, their noise ceiling, and bootstrap intervals over the stimuli.

    brain = load_brain(rdm="subjects.npy")          # (S, N, N), (N, N) or condensed
    brain = load_brain(responses="bold.npy")        # (N, F) or (S, N, F): 1 - Pearson r

The conventions are rsatoolbox's, so that its users get the numbers they know:

- a model RDM is compared with the brain by the Spearman correlation of the upper triangles
  (``compare(..., method='spearman')``), averaged over the subjects (``eval_fixed``);
- the noise ceiling (``boot_noise_ceiling(rdms, method='spearman')``): the upper bound is the
  mean over subjects of each one's correlation with the mean of every subject's ranks, the lower
  bound the same with the mean of the *other* subjects' ranks;
- a bootstrap sample draws N stimuli with replacement and drops the pairs of a stimulus with
  its own copy (``subsample_pattern``: they would be trivially 0); the interval is the 2.5th
  and 97.5th percentile of the K samples' values.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from probe.analyses.compare.rsa import _mean_ranks
from probe.errors import ConfigError, DataError
from probe.file.encodings import decoded

__all__ = ["BrainRDMs", "load_brain", "upper", "spearman_mean", "noise_ceiling",
           "bootstrap_intervals", "draws", "percentile_interval"]


@dataclass(frozen=True)
class BrainRDMs:
    """``matrices[s]`` is subject s's (N, N) RDM; ``index[i]`` the dataset sample of its
    stimulus i (the row it is matched to by the file's ``/index``)."""

    name: str
    matrices: np.ndarray  # (S, N, N) float64
    index: np.ndarray  # (N,) int64

    @property
    def subjects(self) -> int:
        return len(self.matrices)


def load_brain(rdm: str | None = None, responses: str | None = None,
               index: str | None = None) -> BrainRDMs:
    """The brain's RDMs from ``rdm=`` or ``responses=`` (a ``.npy`` file, or ``F.h5:name``),
    their stimuli's dataset samples from ``index=`` (default: 0 .. N-1, dataset order).

    Raises:
        ConfigError: both or neither given, a file that is not there, a shape that is none of
            the accepted ones, an index of another length or with a sample twice.
    """
    if (rdm is None) == (responses is None):
        raise ConfigError("give one of rdm=<an RDM .npy or F.h5:name> and responses=<responses "
                          ".npy or F.h5:name>, not both")
    if rdm is not None:
        matrices = _as_square(_load(rdm, "rdm"), rdm)
        name = f"rdm:{_label(rdm)}"
    else:
        matrices = _from_responses(_load(responses, "responses"), responses)
        name = f"responses:{_label(responses)}"
    n = matrices.shape[1]
    if index is None:
        stimuli = np.arange(n, dtype=np.int64)
    else:
        stimuli = np.asarray(_load(index, "index"))
        if stimuli.ndim != 1 or len(stimuli) != n or not np.issubdtype(stimuli.dtype,
                                                                        np.integer):
            raise ConfigError(f"index={index!r} holds {stimuli.dtype} of shape "
                              f"{stimuli.shape}; it needs the dataset index of each of the "
                              f"{n} stimuli: {n} integers")
        if len(np.unique(stimuli)) != n:
            raise ConfigError(f"index={index!r} names a sample twice; each stimulus is one "
                              "dataset sample")
        stimuli = stimuli.astype(np.int64)
    return BrainRDMs(name, matrices, stimuli)


def _label(spec: str) -> str:
    path, _, name = spec.partition(":") if _is_h5(spec) else (spec, "", "")
    return Path(path).name + (f":{name}" if name else "")


def _is_h5(spec: str) -> bool:
    return any(f"{suffix}:" in spec for suffix in (".h5", ".hdf5"))


def _load(spec: str, option: str) -> np.ndarray:
    if _is_h5(spec):
        path, _, name = spec.rpartition(":")
    else:
        path, name = spec, ""
    if not Path(path).is_file():
        raise ConfigError(f"{option}={spec!r}: there is no such file; give a .npy file or "
                          "F.h5:<dataset>")
    try:
        if name:
            with h5py.File(path, "r") as f:
                if name not in f or not isinstance(f[name], h5py.Dataset):
                    raise ConfigError(f"{option}={spec!r}: {path} has no dataset {name!r}; it "
                                      f"has {sorted(f)}")
                return np.asarray(decoded(f[name])[()])  # bfloat16, float8 rows as floats
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{option}={spec!r} cannot be read ({err}); give a .npy file "
                          "(numpy.save) or F.h5:<dataset>") from None


def _as_square(array: np.ndarray, spec: str) -> np.ndarray:
    array = np.asarray(array, dtype=np.float64)
    if array.ndim == 1:
        array = array[None]
    if array.ndim == 2 and array.shape[0] != array.shape[1]:  # (S, condensed)
        n = (1 + math.isqrt(1 + 8 * array.shape[1])) // 2
        if n * (n - 1) // 2 != array.shape[1]:
            raise ConfigError(f"rdm={spec!r} has shape {array.shape}: a condensed RDM has "
                              "N(N-1)/2 values (scipy.spatial.distance.pdist); give (N, N), "
                              "(S, N, N) or condensed")
        square = np.zeros((len(array), n, n))
        rows, cols = np.triu_indices(n, 1)
        square[:, rows, cols] = array
        square[:, cols, rows] = array
        array = square
    elif array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or array.shape[1] != array.shape[2]:
        raise ConfigError(f"rdm={spec!r} has shape {array.shape}; give (N, N), (S, N, N) for "
                          "S subjects, or condensed (N(N-1)/2,) or (S, N(N-1)/2)")
    if not np.allclose(array, array.transpose(0, 2, 1), rtol=1e-6, atol=1e-9,
                       equal_nan=True):
        raise ConfigError(f"rdm={spec!r} is not symmetric: an RDM holds the dissimilarity of "
                          "each pair of stimuli once each way")
    return _checked(array, f"rdm={spec!r}")


def _from_responses(array: np.ndarray, spec: str) -> np.ndarray:
    array = np.asarray(array, dtype=np.float64)
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or array.shape[2] < 2:
        raise ConfigError(f"responses={spec!r} has shape {array.shape}; give (N, F): a row of "
                          "F responses (voxels, units, channels) per stimulus, or (S, N, F) for "
                          "S subjects")
    centred = array - array.mean(2, keepdims=True)
    norms = np.linalg.norm(centred, axis=2, keepdims=True)
    if np.any(norms == 0):
        raise DataError(f"responses={spec!r}: a stimulus's responses are constant, and their "
                        "correlation with any other is undefined")
    unit = centred / norms
    matrices = 1.0 - unit @ unit.transpose(0, 2, 1)
    for matrix in matrices:
        np.fill_diagonal(matrix, 0.0)
    return _checked(matrices, f"responses={spec!r}")


def _checked(matrices: np.ndarray, what: str) -> np.ndarray:
    if matrices.shape[1] < 3:
        raise ConfigError(f"{what} holds {matrices.shape[1]} stimuli; RSA needs at least 3")
    if not np.all(np.isfinite(upper(torch.from_numpy(matrices)).numpy())):
        raise DataError(f"{what} holds NaN or infinite dissimilarities")
    return matrices


# --- comparisons ----------------------------------------------------------------------------

def upper(matrices: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The upper triangles (above the diagonal, row by row as ``np.triu_indices``) of (N, N)
    or (S, N, N) matrices, as (P,) or (S, P); only the pairs where ``keep`` when given."""
    n = matrices.shape[-1]
    rows, cols = torch.triu_indices(n, n, 1, device=matrices.device)
    values = matrices[..., rows, cols]
    return values if keep is None else values[..., keep]


def _unit(ranks: torch.Tensor) -> torch.Tensor:
    ranks = ranks - ranks.mean(-1, keepdim=True)
    return ranks / ranks.norm(dim=-1, keepdim=True)


def _ranks(vectors: torch.Tensor) -> torch.Tensor:
    return torch.stack([_mean_ranks(v) for v in vectors.reshape(-1, vectors.shape[-1])])


def spearman_mean(model: torch.Tensor, subjects: torch.Tensor) -> float:
    """The mean over subjects of the Spearman correlation of a (P,) upper triangle with each
    row of (S, P): rsatoolbox's ``eval_fixed`` with ``method='spearman'``."""
    a = _unit(_mean_ranks(model))
    b = _unit(_ranks(subjects))
    return float((b @ a).clamp(-1.0, 1.0).mean())


def noise_ceiling(subjects: torch.Tensor) -> tuple[float, float]:
    """(lower, upper) of (S, P) subject triangles, S >= 2: rsatoolbox's
    ``boot_noise_ceiling(rdms, method='spearman')``."""
    ranks = _ranks(subjects)
    unit = _unit(ranks)
    total = ranks.sum(0)
    count = len(ranks)
    upper_bound = (unit @ _unit(_mean_ranks(total / count))).mean()
    lower = torch.stack([unit[s] @ _unit(_mean_ranks((total - ranks[s]) / (count - 1)))
                         for s in range(count)]).mean()
    return float(lower), float(upper_bound)


def bootstrap_intervals(left: Mapping[str, torch.Tensor], right: Mapping[str, torch.Tensor],
                        pairs: Sequence[tuple[str, str]], samples: int, seed: int,
                        level: float = 0.95) -> dict[tuple[str, str], tuple[float, float]]:
    """Percentile intervals of each pair's value over ``samples`` bootstrap draws of the
    stimuli (seeded): ``left[a]`` and ``right[b]`` are (S, N, N) matrices (S = 1 for a model's
    key), a pair's value the mean Spearman correlation over both sides' matrices.

    Each draw (``draws``) keeps the pairs of two different stimuli.
    """
    n = next(iter(left.values())).shape[-1]
    found: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    names = {"l": list(dict.fromkeys(a for a, _ in pairs)),
             "r": list(dict.fromkeys(b for _, b in pairs))}
    for chosen in draws(n, samples, seed):
        rows, cols = np.triu_indices(n, 1)
        keep = torch.from_numpy(chosen[rows] != chosen[cols])
        pick = torch.from_numpy(chosen)
        units = {}
        for side, sources in (("l", left), ("r", right)):
            for name in names[side]:
                matrices = sources[name][..., pick, :][..., :, pick]
                units[side, name] = _unit(_ranks(upper(matrices, keep.to(matrices.device))))
        for a, b in pairs:
            values = units["l", a] @ units["r", b].T
            found[(a, b)].append(float(values.clamp(-1.0, 1.0).mean()))
    return {pair: percentile_interval(values, level) for pair, values in found.items()}


def draws(n: int, samples: int, seed: int) -> Iterator[np.ndarray]:
    """``samples`` bootstrap draws of ``n`` items with replacement, each sorted:
    ``np.sort(rng.integers(0, n, n))`` of ``np.random.default_rng(seed)``, one after another."""
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        yield np.sort(rng.integers(0, n, n))


def percentile_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap values, NaNs left out."""
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(values, [tail, 100 - tail])
    return float(low), float(high)
