"""Which samples of a dataset a job takes: ``limit``, ``subset`` and ``shard``.

    select_indices(size, limit, shard_index, shard_count)   the dataset indices, in order
    OpenSelection(limit, shard_index, shard_count)          the same for a dataset read as it
                                                            comes, whose length is not known
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from probe.errors import ConfigError

__all__ = ["OpenSelection", "Selection", "select_indices", "check_selection"]


@dataclass(frozen=True)
class OpenSelection:
    """The samples a job takes from a dataset read as it comes, whose length is not known
    before its end: among the first ``limit`` (None: all), those of its shard, after the first
    ``start`` of them (a resumed run's committed rows)."""

    limit: int | None
    shard_index: int = 0
    shard_count: int = 1
    start: int = 0

    def __getitem__(self, rows: slice) -> OpenSelection:
        """``selection[n:]``: the same samples after the first n (``[:n]`` is not known)."""
        if not isinstance(rows, slice) or rows.step not in (None, 1) or rows.stop is not None:
            raise TypeError("an open selection can only be sliced as [n:]")
        return replace(self, start=self.start + (rows.start or 0))

    def __bool__(self) -> bool:
        return True

    def takes(self, sample: int) -> bool | None:
        """Whether sample ``sample`` (in reading order) is this job's; None past the limit."""
        if self.limit is not None and sample >= self.limit:
            return None
        return sample % self.shard_count == self.shard_index


# the samples a job takes, in order: dataset indices, or an open selection
Selection = list[int] | OpenSelection


def check_selection(limit: int | None, shard_index: int, shard_count: int) -> None:
    """Refuse a limit or shard that selects nothing.

    Raises:
        ConfigError: naming the value.
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit} must be at least 1, or null for the whole dataset")
    if shard_count < 1 or not 0 <= shard_index < shard_count:
        raise ConfigError(
            f"shard.index={shard_index}, shard.count={shard_count}: need count >= 1 and "
            "0 <= index < count"
        )


def select_indices(size: int, limit: int | None = None, shard_index: int = 0,
                   shard_count: int = 1, subset: str = "first", seed: int = 0) -> list[int]:
    """The dataset indices one job writes, in order: ``limit`` of them (the first, or a random
    choice seeded by ``seed``), then every ``shard_count``-th starting at ``shard_index``.

    Raises:
        ConfigError: a bad limit or shard.
    """
    check_selection(limit, shard_index, shard_count)
    chosen = list(range(size))
    if limit is not None and limit < size:
        if str(subset) == "random":
            order = torch.randperm(size, generator=torch.Generator().manual_seed(int(seed)))
            chosen = sorted(order[:limit].tolist())
        else:
            chosen = chosen[:limit]
    indices = chosen[shard_index::shard_count]
    if not indices:
        raise ConfigError(
            f"this job has no samples: the dataset has {size}, limit={limit}, "
            f"shard {shard_index} of {shard_count}"
        )
    return indices
