"""How shards nest: the part of a job's shard that one of its ranks takes, and that rank's file.

A job with ``shard.index=c shard.count=C`` takes the samples at positions ``p % C == c`` of the
run's selection. Started by torchrun with K ranks, rank ``r`` takes every K-th of those: the
positions ``p % (C * K) == c + C * r``, which is itself a strided shard. The K rank shards of
job c are then exactly job c's samples, and the C x K rank shards of all jobs cover every
sample once, so the existing resume and merge code serves them unchanged::

    nested_shard(0, 1, rank=1, ranks=2)   # (1, 2): one node, rank 1 of 2
    nested_shard(1, 3, rank=1, ranks=2)   # (4, 6): job 1 of 3, rank 1 of 2
    rank_path(Path("out/features.h5"), 1, 2)   # out/features.rank-1-of-2.h5
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["nested_shard", "rank_path", "rank_files"]


def nested_shard(index: int, count: int, rank: int, ranks: int) -> tuple[int, int]:
    """The ``(shard.index, shard.count)`` of rank ``rank`` of ``ranks`` inside shard
    ``index`` of ``count``."""
    assert 0 <= index < count and 0 <= rank < ranks, (index, count, rank, ranks)
    return index + count * rank, count * ranks


def rank_path(path: Path, rank: int, ranks: int) -> Path:
    """The file of rank ``rank`` of ``ranks`` of a run whose file is ``path``: beside it,
    ``<stem>.rank-<rank>-of-<ranks><suffix>``."""
    return path.with_name(f"{path.stem}.rank-{rank}-of-{ranks}{path.suffix}")


def rank_files(path: Path) -> list[Path]:
    """Every finished or partial rank file beside ``path``, of any number of ranks."""
    pattern = f"{path.stem}.rank-*-of-*{path.suffix}"
    found = {p.with_name(p.name.removesuffix(".partial"))
             for p in [*path.parent.glob(pattern), *path.parent.glob(pattern + ".partial")]}
    return sorted(found)
