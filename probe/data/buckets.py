"""Which samples of different lengths go into which batch (language models' documents).

A right-padded batch computes ``batch length x longest sample`` positions, and the padding
among them is work thrown away (41% of it on a corpus of 16 to 128 tokens in random batches of
16). With ``bucket_by_length`` the samples of each group of 16 x ``batch_size`` consecutive
ones are sorted by length before they are cut into batches, so that a batch holds samples of
similar length; the writer puts each group's rows back in dataset order before they are
stored. ``batch_tokens`` cuts batches by a budget of padded positions instead of a number of
samples.

Groups are fixed by position, so a run resumed at a group's start makes the very same batches
as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from probe.data.feed import Batch, Batching, LoadedItems, batch_loader

__all__ = ["plan_batches", "planned_batches"]


def plan_batches(lengths: np.ndarray, batching: Batching) -> list[tuple[np.ndarray, bool]]:
    """Batches of positions into ``lengths`` (each sample's length in tokens), each with
    whether it ends a group; every position once."""
    if batching.group == 1:
        return [(np.arange(start, min(start + batching.batch_size, len(lengths))), True)
                for start in range(0, len(lengths), batching.batch_size)]
    batches: list[tuple[np.ndarray, bool]] = []
    for start in range(0, len(lengths), batching.group):
        positions = np.arange(start, min(start + batching.group, len(lengths)))
        if batching.bucket:  # by length, ties in dataset order
            positions = positions[np.argsort(lengths[positions], kind="stable")]
        cut = _cut(lengths[positions], batching)
        batches += [(part, False) for part in np.split(positions, cut)]
        batches[-1] = (batches[-1][0], True)
    return batches


def _cut(lengths: np.ndarray, batching: Batching) -> list[int]:
    # where to split a group's (ordered) samples into batches
    if batching.batch_tokens is None:
        return list(range(batching.batch_size, len(lengths), batching.batch_size))
    cuts, first, longest = [], 0, 0
    for n, length in enumerate(lengths):
        longest = max(longest, int(length))
        if n > first and longest * (n - first + 1) > batching.batch_tokens:
            cuts.append(n)
            first, longest = n, int(length)
    return cuts


def planned_batches(dataset, selection: list[int], planned: list[tuple[np.ndarray, bool]],
                    collate: Callable, batching: Batching) -> Iterator[Batch]:
    """The batches that ``planned`` (``plan_batches`` over the selection's positions) makes of
    ``dataset``'s selected samples, collated by a DataLoader's workers, each saying whether it
    ends its group."""
    loader = batch_loader(LoadedItems(dataset, selection), collate,
                          num_workers=batching.num_workers, pin_memory=batching.pin_memory,
                          batch_sampler=[positions.tolist() for positions, _ in planned])
    for batch, (_, ends_group) in zip(loader, planned, strict=True):
        batch.ends_group = ends_group
        yield batch
