"""Rows projected on K values before they are stored (reduce=pca|srp): a row (flattened) x is
stored as (x - mean) @ components.T; ``inverse`` maps stored rows back to the row's space
(components.T for pca's orthonormal axes, the pseudo-inverse for a random projection).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from probe.file.transforms import inverse

__all__ = ["Projection"]


@dataclass
class Projection:
    """A fitted (pca) or drawn (srp) projection of rows of width D on K values."""

    method: str  # pca or srp
    mean: torch.Tensor  # (D,) float32
    components: torch.Tensor  # (K, D) float32
    explained_variance: torch.Tensor | None = None  # pca: (K,) the fit rows' variance per axis
    attrs: dict = field(default_factory=dict)  # how it was made, as the file records it
    _on: dict = field(default_factory=dict, repr=False)  # its tensors, by device

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` (first axis the rows) flattened and projected, in float32, on their device."""
        mean, components = self._tensors(rows.device)
        return (rows.flatten(1).float() - mean) @ components.T

    def inverse(self, stored: torch.Tensor) -> torch.Tensor:
        """Rows of the row space estimated from projected ones (float32, on the CPU), as a
        file's readers map them (probe.file.transforms)."""
        return torch.from_numpy(inverse(self.stored(), stored.numpy()))

    def stored(self) -> dict:
        """What the file keeps of it (probe.file.transforms)."""
        ev = self.explained_variance
        return {"mean": self.mean.numpy(), "components": self.components.numpy(),
                "explained_variance": None if ev is None else ev.numpy(), "attrs": self.attrs}

    @classmethod
    def from_stored(cls, stored: dict) -> Projection:
        """The projection a file keeps (a resumed run's: never fitted again)."""
        ev = stored.get("explained_variance")
        return cls(str(stored["attrs"]["method"]), torch.from_numpy(stored["mean"]),
                   torch.from_numpy(stored["components"]),
                   None if ev is None else torch.from_numpy(ev), dict(stored["attrs"]))

    def fidelity_attrs(self) -> dict:
        """What the report adds for this projection: pca's kept share of the fit variance."""
        if self.explained_variance is None:
            return {}
        return {"fidelity_explained_variance": float(self.attrs["explained_variance_ratio"])}

    def _tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:
            self._on[device] = (self.mean.to(device), self.components.to(device))
        return self._on[device]
