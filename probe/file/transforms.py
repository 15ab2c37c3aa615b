"""The projections of reduce=pca|srp as a file keeps them: ``/transform/<layer>/<kind>/`` holds
``mean`` (D,), ``components`` (K, D) and, for pca, ``explained_variance`` (K,), its attrs say
how it was made (method, fit_samples, fit_rows, explained_variance_ratio; density, seed). A
stored row is ``(x - mean) @ components.T``; ``inverse`` maps stored rows back to estimates of
the rows (``components.T`` for pca's orthonormal axes, the pseudo-inverse for a random matrix).
"""

from __future__ import annotations

from collections.abc import Mapping

import h5py
import numpy as np

from probe.file.format import TRANSFORM, Attr, transform_path

__all__ = ["write_transforms", "read_transforms", "inverse", "PARTS"]

PARTS = ("mean", "components", "explained_variance")
# the name of each axis of each part, as every dataset of a probe file says it (attr dims)
_DIMS = {"mean": ["feature"], "components": ["component", "feature"],
         "explained_variance": ["component"]}


def write_transforms(f: h5py.File, transforms: Mapping[str, Mapping]) -> None:
    """``transforms``: {key: {"mean", "components", "explained_variance" (or None),
    "attrs"}}, each part a numpy array."""
    for key, transform in transforms.items():
        group = f.require_group(transform_path(key))
        for part in PARTS:
            if transform.get(part) is not None:
                dataset = group.create_dataset(part, data=np.asarray(transform[part],
                                                                     dtype=np.float32))
                dataset.attrs[Attr.DIMS] = np.array(_DIMS[part], dtype=h5py.string_dtype())
        group.attrs.update(dict(transform.get("attrs", {})))


def read_transforms(f: h5py.File) -> dict[str, dict]:
    """Every stored transform, by key, as ``write_transforms`` takes them."""
    found: dict[str, dict] = {}
    root = f.get(TRANSFORM)
    if not isinstance(root, h5py.Group):
        return found
    for layer, group in root.items():
        for kind, parts in group.items():
            found[f"{layer}/{kind}"] = {
                **{part: (parts[part][()] if part in parts else None) for part in PARTS},
                "attrs": dict(parts.attrs)}
    return found


def inverse(transform: Mapping, rows: np.ndarray) -> np.ndarray:
    """Stored rows (n, K) mapped back to the row space (n, D), in float32."""
    components = np.asarray(transform["components"], dtype=np.float64)
    back = components if transform["attrs"].get("method") == "pca" else np.linalg.pinv(
        components).T
    return (np.asarray(rows, dtype=np.float64) @ back + transform["mean"]).astype(np.float32)
