"""Shards nest: a job's ranks take a finer strided split (probe.pipeline.shards), their files
merge into a file that is itself the job's shard, and the jobs' files merge into the whole run,
also beside the file of a job that ran as one process. In this process, with a tiny model."""

from __future__ import annotations

import h5py
import pytest

import probe
from probe.errors import OutputError
from probe.file.merge import merge
from probe.pipeline.shards import nested_shard, rank_files, rank_path
from tests.conftest import TINY_NET, assert_same_datasets, compose_cfg

# batch_size=1: each sample is computed alone in every run, so values match bit for bit
RUN = [*TINY_NET, "layers=[features.0,fc]", "dataset.image_size=16", "dataset.num_samples=11",
       "batch_size=1"]
KEYS = ("index", "target", "features.0/output", "fc/output")


def _run(path, index: int = 0, count: int = 1):
    return probe.run(compose_cfg(*RUN, f"shard.index={index}", f"shard.count={count}",
                                 output=path, tiny=False))


@pytest.mark.parametrize(("count", "ranks"), [(1, 2), (2, 2), (3, 2), (2, 3), (1, 1)])
def test_nested_shards_cover_every_sample_once_within_their_job(count, ranks):
    size = 29
    owner = {}
    for job in range(count):
        mine = set(range(size)[job::count])
        parts = []
        for rank in range(ranks):
            index, total = nested_shard(job, count, rank, ranks)
            part = set(range(size)[index::total])
            assert part <= mine
            parts.append(part)
            for sample in part:
                assert sample not in owner, (sample, owner[sample], (job, rank))
                owner[sample] = (job, rank)
        assert set().union(*parts) == mine
    assert sorted(owner) == list(range(size))


def test_rank_files_sit_beside_the_output(tmp_path):
    out = tmp_path / "features.h5"
    assert rank_path(out, 1, 4) == tmp_path / "features.rank-1-of-4.h5"
    (tmp_path / "features.rank-0-of-2.h5").touch()
    (tmp_path / "features.rank-1-of-2.h5.partial").touch()
    (tmp_path / "other.rank-0-of-2.h5").touch()
    assert [p.name for p in rank_files(out)] == ["features.rank-0-of-2.h5",
                                                 "features.rank-1-of-2.h5"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process's run, each of 2 jobs' shard files, and each job's 2 rank files (a 4-way
    split) merged into the job's file, as torchrun on two nodes leaves them."""
    d = tmp_path_factory.mktemp("nested")
    jobs = [_run(d / f"job{c}.h5", c, 2) for c in range(2)]
    nodes = []
    for c in range(2):
        ranks = [_run(d / f"node{c}" / f"features.rank-{r}-of-2.h5", *nested_shard(c, 2, r, 2))
                 for r in range(2)]
        nodes.append(merge(d / f"node{c}" / "features.h5", ranks, into=(c, 2)))
    return {"single": _run(d / "single.h5"), "jobs": jobs, "nodes": nodes, "dir": d}


def test_a_jobs_ranks_merge_into_that_jobs_shard(runs):
    for c, (node, job) in enumerate(zip(runs["nodes"], runs["jobs"], strict=True)):
        assert_same_datasets(node, job, KEYS)
        with probe.open(node) as f, h5py.File(node, "r") as raw:
            assert (f.config.shard.index, f.config.shard.count) == (c, 2)
            assert (raw.attrs["shard_index"], raw.attrs["shard_count"]) == (c, 2)
            assert raw["fc/output"].is_virtual


def test_the_jobs_files_merge_into_the_whole_run(runs, tmp_path):
    out = merge(tmp_path / "all.h5", runs["nodes"])
    assert_same_datasets(out, runs["single"], KEYS)
    with h5py.File(out, "r") as f:
        # the jobs' files stand for their rank files: one level of links, all four of them
        sources = {s.file_name for s in f["fc/output"].virtual_sources()}
        assert len(sources) == 4 and all("rank-" in s for s in sources)
    with probe.open(out) as f:
        assert f.config.shard.count == 1 and f.num_rows == 11


def test_a_torchrun_jobs_file_merges_beside_a_plain_jobs_file(runs, tmp_path):
    out = merge(tmp_path / "mixed.h5", [runs["nodes"][0], runs["jobs"][1]])
    assert_same_datasets(out, runs["single"], KEYS)
    copied = merge(tmp_path / "copied.h5", [runs["nodes"][1], runs["jobs"][0]], copy=True)
    assert_same_datasets(copied, runs["single"], KEYS)


def test_shards_that_do_not_cover_the_run_once_are_refused(runs, tmp_path):
    d, out = runs["dir"], tmp_path / "bad.h5"
    rank0 = d / "node0" / "features.rank-0-of-2.h5"
    with pytest.raises(OutputError, match=r"shard 0 of 4 .* is not a part of shard 1 of 2"):
        merge(out, [rank0, d / "node1" / "features.rank-1-of-2.h5"], into=(1, 2))
    with pytest.raises(OutputError, match=r"shard\(s\) \[2\] of 4 are missing"):
        merge(out, [rank0], into=(0, 2))
    with pytest.raises(OutputError, match="hold some of the same samples"):
        merge(out, [runs["jobs"][0], rank0, runs["jobs"][1]])
    with pytest.raises(OutputError, match=r"\(index, count\) leave samples out"):
        merge(out, [rank0, runs["jobs"][1]])
    assert not list(tmp_path.iterdir())


def test_a_jobs_file_without_its_rank_files_is_refused_by_name(runs, tmp_path):
    import shutil

    shutil.copy(runs["nodes"][0], tmp_path / "features.h5")  # its rank files stay behind
    with pytest.raises(OutputError, match=r"features\.rank-0-of-2\.h5' does not exist"):
        merge(tmp_path / "all.h5", [tmp_path / "features.h5", runs["jobs"][1]])
