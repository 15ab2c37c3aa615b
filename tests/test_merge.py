"""Shards of one run merge into a file equal to a single run: virtual by default, or copied."""

from __future__ import annotations

import os

import h5py
import pytest

import probe
import probe.file.merge
from probe.errors import OutputError
from probe.file.merge import merge
from tests.conftest import assert_same_datasets, cli

# batch_size=1: each sample is computed alone in every run, so values match bit for bit
RUN = ["model=resnet18", "layers=[layer4,fc]", "hooks=[forward,backward]", "limit=5",
       "batch_size=1"]


@pytest.fixture
def shards(make_cfg, tmp_path):
    def make(count: int = 3, *extra: str):
        return [probe.run(make_cfg(*RUN, f"shard.count={count}", f"shard.index={k}", *extra,
                                   output=tmp_path / f"shard{k}" / "features.h5"))
                for k in range(count)]
    return make


@pytest.fixture
def single(make_cfg, tmp_path):
    return probe.run(make_cfg(*RUN, output=tmp_path / "single.h5"))


def _assert_equal_files(a, b) -> None:
    assert_same_datasets(a, b, ("index", "target", "layer4/output", "layer4/grad_output",
                                "fc/output"))


def test_three_shards_merge_into_the_single_run(shards, single, tmp_path):
    out = merge(tmp_path / "merged.h5", shards(3))
    _assert_equal_files(out, single)
    with h5py.File(out, "r") as f:
        assert f["layer4/output"].is_virtual and not f["index"].is_virtual
        assert f.attrs["complete"] and f.attrs["num_samples"] == 5
    with probe.open(out) as f:
        assert f.index.tolist() == [0, 1, 2, 3, 4] and f.config.shard.count == 1


def test_the_merged_file_moves_with_its_shards(shards, single, tmp_path):
    merged = merge(tmp_path / "merged.h5", shards(2))
    with h5py.File(merged, "r") as f:  # relative, as the links are
        sources = [str(name) for name in f.attrs["merged_from"]]
    assert sources and not any(os.path.isabs(name) for name in sources), sources
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    os.rename(tmp_path, moved)
    try:
        _assert_equal_files(moved / "merged.h5", moved / "single.h5")
    finally:
        os.rename(moved, tmp_path)


def test_copy_is_self_contained(shards, single, tmp_path):
    parts = shards(2)
    out = merge(tmp_path / "copied.h5", parts, copy=True)
    for part in parts:
        part.unlink()
    with h5py.File(out, "r") as f:
        assert not f["layer4/output"].is_virtual
    _assert_equal_files(out, single)


def test_copy_goes_a_block_at_a_time(shards, single, tmp_path, monkeypatch):
    # blocks of 2 rows over 3 shards: every block takes rows from shards in another order
    monkeypatch.setattr(probe.file.merge, "chunk_shape", lambda row, size, total, **_: (2, *row))
    monkeypatch.setattr(probe.file.merge, "_COPY_BLOCK_BYTES", 1)
    out = merge(tmp_path / "copied.h5", shards(3), copy=True)
    with h5py.File(out, "r") as f:
        assert f["layer4/output"].chunks[0] == 2
    _assert_equal_files(out, single)


def test_refusals_leave_no_output(shards, make_cfg, tmp_path):
    parts = shards(3)
    out = tmp_path / "merged.h5"
    with pytest.raises(OutputError, match=r"shard\(s\) \[2\] of 3 are missing"):
        merge(out, parts[:2])
    with pytest.raises(OutputError, match="given twice"):
        merge(out, [parts[0], parts[1], parts[1], parts[2]])
    other = probe.run(make_cfg(*RUN, "reduce=mean", "shard.count=3", "shard.index=2",
                               output=tmp_path / "other.h5"))
    with pytest.raises(OutputError, match=r"other\.h5.*another config.*reduce"):
        merge(out, [parts[0], parts[1], other])
    with h5py.File(parts[2], "r+") as f:
        f.attrs["complete"] = False
    with pytest.raises(OutputError, match=r"shard2/features\.h5.*not complete"):
        merge(out, parts)
    with pytest.raises(OutputError, match="does not exist"):
        merge(out, [parts[0], tmp_path / "nope.h5"])
    assert not out.exists() and not list(tmp_path.glob("merged*"))


def test_merge_cli(shards, tmp_path, monkeypatch, capsys):
    from probe.commands.merge import main

    parts = shards(2)
    monkeypatch.chdir(tmp_path)
    main(["-o", "merged.h5", *map(str, parts)])
    assert (tmp_path / "merged.h5").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["-o", "merged.h5", str(parts[0])])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == ("probe: error: shard(s) [1] of 2 are missing; pass every "
                                       "shard file\n")


def _sweep(tmp_path, parts, count: int | None = None):
    """A sweep folder laid out as a multirun's jobs are, one job per shard file (shards 0, 1,
    ... of ``count``, by default as many as there are files); its config."""
    import shutil

    import yaml
    from omegaconf import OmegaConf

    from probe.config.schema import NEUTRAL_KEYS

    sweep = tmp_path / "sweep"
    for k, part in enumerate(parts):
        job = sweep / f"job{k}"
        (job / ".hydra").mkdir(parents=True)
        shutil.copy(part, job / "features.h5")
        overrides = [*RUN, f"shard.count={count or len(parts)}", f"shard.index={k}"]
        (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    return sweep, OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "job": {"config": {
        "override_dirname": {"exclude_keys": list(NEUTRAL_KEYS)}}}}})


def test_the_sweep_callback_merges_each_complete_set(shards, single, tmp_path):
    from probe.commands.merge import MergeShards

    sweep, config = _sweep(tmp_path, shards(2))
    MergeShards().on_multirun_end(config)
    (merged,) = sweep.glob("*.h5")
    assert merged.name == ("hooks-forward+backward+layers-layer4+fc+limit-5+model-resnet18+"
                           "shard.count-2.h5")
    _assert_equal_files(merged, single)


def test_a_set_that_does_not_merge_fails_the_sweep_in_one_line(shards, tmp_path, monkeypatch,
                                                              capsys):
    """As a pairs run's captions did (h5py could not map strings): the sweep exited 0 with a
    Hydra warning and no merged file."""
    from probe.commands.merge import MergeShards

    sweep, config = _sweep(tmp_path, shards(2))

    def broken(out, shards, **options):
        raise TypeError("no appropriate function for conversion path")
    monkeypatch.setattr(probe.file.merge, "merge", broken)
    capsys.readouterr()  # the shards' runs' progress bars
    with pytest.raises(SystemExit) as exit_:  # not an Exception: Hydra would only warn
        MergeShards().on_multirun_end(config)
    assert exit_.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("probe: error: the shards of hooks-forward+backward") and (
        "did not merge (TypeError: no appropriate function for conversion path); merge them "
        "with python -m probe.merge -o ") in line, line
    assert not list(sweep.glob("*.h5"))


def test_a_sweep_of_some_shards_only_is_left_unmerged(shards, tmp_path, caplog):
    from probe.commands.merge import MergeShards

    sweep, config = _sweep(tmp_path, shards(3)[:2], count=3)
    with caplog.at_level("INFO"):
        MergeShards().on_multirun_end(config)  # no SystemExit
    assert "are missing" in caplog.text and not list(sweep.glob("*.h5"))


@pytest.mark.slow
def test_a_submitit_local_multirun_merges_into_the_single_run(tmp_path, single):
    args = ["-m", "hydra/launcher=submitit_local", *RUN, "dataset.image_size=32",
            "dataset.num_samples=6", "shard.count=2", "shard.index=range(2)"]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    parts = sorted((tmp_path / "outputs" / "multirun").glob("*shard.index-*/features.h5"))
    assert len(parts) == 2, result.stdout + result.stderr
    _assert_equal_files(merge(tmp_path / "merged.h5", parts), single)
    # the sweep's callback merged them too, beside the job folders
    (auto,) = (tmp_path / "outputs" / "multirun").glob("*.h5")
    assert "shard.index" not in auto.name and "shard.count-2" in auto.name
    _assert_equal_files(auto, single)
    # a re-launched sweep skips the jobs whose files are complete
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 0
    logs = list((tmp_path / "outputs" / "multirun").rglob("probe.log"))
    assert sum("nothing to do" in log.read_text() for log in logs) == 2
