"""Reading a probe file back: ``probe.open(path)``.

Plain h5py reads every file this package writes; this reader adds the checks (a file that is not
complete is refused unless asked) and a few conveniences.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from omegaconf import DictConfig, OmegaConf

from probe.errors import OutputError
from probe.store import partial_path

__all__ = ["open", "FeatureFile"]

_open = open  # the builtin, before this module's `open` hides it


def open(path: str | Path, *, allow_partial: bool = False) -> FeatureFile:  # noqa: A001
    """Open a finished probe file for reading (use it in a ``with`` block).

    Example::

        with probe.open("outputs/.../features.h5") as f:
            x = f["features.28/output"][:100]     # numpy, read lazily from disk
            y = f.target[:100]

    Args:
        path: the file a run wrote (or its ``.partial`` twin when ``allow_partial``).
        allow_partial: read the committed rows of a file whose run has not finished.

    Raises:
        FileNotFoundError: no such file.
        OutputError: the run that writes it has not finished (and not ``allow_partial``).
    """
    return FeatureFile(path, allow_partial=allow_partial)


class FeatureFile:
    """A probe HDF5 file: its datasets by "<layer>/<kind>", row index, targets and config."""

    def __init__(self, path: str | Path, *, allow_partial: bool = False):
        path = Path(path)
        if not path.exists() and partial_path(path).exists():
            path = partial_path(path) if allow_partial else path
            if not allow_partial:
                raise OutputError(
                    f"{str(path)!r} is not finished: its run is still going or was stopped. "
                    "Run the same command again to resume it, or pass allow_partial=True to "
                    "read the committed rows"
                )
        if not path.exists():
            raise FileNotFoundError(f"no probe file at {str(path)!r}")
        self.path = path
        self._file = h5py.File(path, "r")
        attrs = self._file.attrs
        self.complete = bool(attrs.get("complete", False))
        if not self.complete and not allow_partial:
            message = (
                f"{str(path)!r} is not complete ({int(attrs.get('num_committed', 0))} of "
                f"{int(attrs.get('num_samples', 0))} rows); run the same command again to finish "
                "it, or pass allow_partial=True to read the committed rows"
            )
            self._file.close()
            raise OutputError(message)
        self.num_rows = int(attrs["num_samples"] if self.complete else attrs["num_committed"])

    def __enter__(self) -> FeatureFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    @property
    def keys(self) -> list[str]:
        """Every stored "<layer>/<kind>", in file order."""
        return [f"{layer}/{kind}" for layer in self.layers for kind in self._file[layer]]

    @property
    def layers(self) -> list[str]:
        return [name for name, obj in self._file.items() if isinstance(obj, h5py.Group)]

    def __getitem__(self, key: str) -> h5py.Dataset:
        """The h5py dataset (lazy: slice it to read); of a partial file, only the first
        ``num_rows`` rows are committed."""
        if key not in self._file or not isinstance(self._file[key], h5py.Dataset):
            raise KeyError(f"{key!r} is not in {self.path}; it holds {self.keys}")
        return self._file[key]

    @property
    def index(self) -> np.ndarray:
        return self._file["index"][: self.num_rows]

    @property
    def target(self) -> np.ndarray | None:
        return self._file["target"][: self.num_rows] if "target" in self._file else None

    @property
    def attrs(self) -> dict:
        return dict(self._file.attrs)

    @property
    def config(self) -> DictConfig:
        """The resolved config of the run that wrote the file."""
        return OmegaConf.create(str(self._file.attrs["config"]))

    def __repr__(self) -> str:
        state = "complete" if self.complete else "partial"
        return f"FeatureFile({str(self.path)!r}, {self.num_rows} rows, {state}, {self.keys})"
