"""Streaming rows from a probe file: every selected row once, in whole chunks, reproducibly."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError, OutputError
from probe.file.read import open_checked
from probe.file.rows import RowLoader, row_blocks

N, CHUNK = 103, 8  # rows, rows per chunk: the last chunk is short


def _write(path, *, rows=N, committed=None, with_target=True, chunked=True):
    """A file in probe's layout whose row i holds the value i in its first column."""
    values = np.zeros((rows, 3), dtype=np.float32)
    values[:, 0] = np.arange(rows)
    values[:, 1:] = np.random.default_rng(0).normal(size=(rows, 2))
    with h5py.File(path, "w") as f:
        f.attrs.update({"config": "{}", "complete": committed is None, "num_samples": rows,
                        "num_committed": rows if committed is None else committed,
                        "layers": np.array(["l"], dtype=h5py.string_dtype()),
                        "hooks": np.array(["forward"], dtype=h5py.string_dtype())})
        f["index"] = np.arange(rows) * 10
        if with_target:
            f["target"] = np.arange(rows) % 7
        options = {"chunks": (CHUNK, 3), "maxshape": (None, 3)} if chunked else {}
        f.create_dataset("l/output", data=values, **options)
    return path


@pytest.fixture
def path(tmp_path):
    return _write(tmp_path / "f.h5")


def _ids(batches) -> list[int]:
    return [int(v) for x, _ in batches for v in x[:, 0]]


def test_in_order_with_targets(path):
    with probe.open(path) as f:
        batches = list(f.loader("l/output", batch_size=10))
        stored = f["l/output"][:]
    assert [len(x) for x, _ in batches] == [10] * 10 + [3]
    np.testing.assert_array_equal(torch.cat([x for x, _ in batches]).numpy(), stored)
    np.testing.assert_array_equal(torch.cat([y for _, y in batches]).numpy(), np.arange(N) % 7)
    assert batches[0][0].dtype == torch.float32 and batches[0][1].dtype == torch.int64


def test_subset_of_rows(path):
    rows = [101, 3, 4, 50, 9, 3]
    with probe.open(path) as f:
        loader = f.loader("l/output", batch_size=2, rows=rows)
        assert len(loader) == 3
        assert _ids(loader) == sorted(set(rows))
        for x, y in f.loader("l/output", batch_size=4, rows=rows, shuffle=True):
            np.testing.assert_array_equal(y.numpy(), x[:, 0].numpy().astype(int) % 7)
        with pytest.raises(IndexError, match="103"):
            f.loader("l/output", rows=[103])


def test_shuffle_is_a_permutation_fixed_by_the_seed(path):
    rows = np.arange(0, N, 2)
    with probe.open(path) as f:
        first = f.loader("l/output", batch_size=16, shuffle=True, seed=3, rows=rows)
        again = f.loader("l/output", batch_size=16, shuffle=True, seed=3, rows=rows)
        other = f.loader("l/output", batch_size=16, shuffle=True, seed=4, rows=rows)
        passes = [_ids(first), _ids(first)]
        assert passes == [_ids(again), _ids(again)]  # pass e of the same seed is the same
        assert _ids(other) != passes[0]
    for order in passes:
        assert sorted(order) == rows.tolist() and order != rows.tolist()
    assert passes[0] != passes[1]  # each pass shuffles anew
    # rows from several blocks are mixed in one batch (the whole file fits in the buffer)
    assert len({i // CHUNK for i in passes[0][:16]}) > 2


class _Recorder:
    """An h5py dataset that records the row ranges read from it."""

    def __init__(self, dataset):
        self.dataset, self.reads = dataset, []
        self.chunks, self.shape, self.dtype = dataset.chunks, dataset.shape, dataset.dtype

    def __getitem__(self, key):
        self.reads.append((key.start, key.stop))
        return self.dataset[key]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("buffer_bytes", [1, 40 * 12, 1 << 20])
def test_reads_whole_chunks_and_every_row_once(path, shuffle, buffer_bytes):
    with h5py.File(path, "r") as f:
        dataset = _Recorder(f["l/output"])
        loader = RowLoader(dataset, f["target"][:], num_rows=N, batch_size=5, shuffle=shuffle,
                           buffer_bytes=buffer_bytes)
        ids = _ids(loader)
    assert sorted(ids) == list(range(N))
    assert all(start % CHUNK == 0 and (stop % CHUNK == 0 or stop == N)
               for start, stop in dataset.reads)
    assert sum(stop - start for start, stop in dataset.reads) == N  # no chunk read twice


def test_contiguous_dataset_streams_in_batch_sized_reads(tmp_path):
    path = _write(tmp_path / "c.h5", chunked=False)
    with h5py.File(path, "r") as f:
        assert f["l/output"].chunks is None
        assert row_blocks(f["l/output"], N, 50) == [(0, 50), (50, 100), (100, 103)]
    with probe.open(path) as f:
        assert sorted(_ids(f.loader("l/output", batch_size=10, shuffle=True))) == list(range(N))


def test_row_blocks_hold_whole_chunks(path):
    with h5py.File(path, "r") as f:
        assert row_blocks(f["l/output"], N, 1)[:2] == [(0, 8), (8, 16)]
        assert row_blocks(f["l/output"], N, 20) == [(0, 24), (24, 48), (48, 72), (72, 96),
                                                     (96, 103)]


def test_partial_file_streams_committed_rows_only(tmp_path):
    path = _write(tmp_path / "p.h5", committed=45)
    with pytest.raises(OutputError, match="allow_partial"):
        probe.open(path)
    with probe.open(path, allow_partial=True) as f:
        assert _ids(f.loader("l/output", batch_size=7, shuffle=True)) != list(range(45))
        assert sorted(_ids(f.loader("l/output", batch_size=7, shuffle=True))) == list(range(45))


def test_open_checked_explains_unfinished_and_missing_files(tmp_path):
    _write(tmp_path / "run.h5.partial", committed=45)
    with pytest.raises(OutputError, match="not finished.*run the same probe command again"):
        open_checked(tmp_path / "run.h5")
    path = _write(tmp_path / "stopped.h5", committed=45)
    with pytest.raises(OutputError, match=r"not complete \(45 of 103 rows\)"):
        open_checked(path)
    with pytest.raises(DataError, match="does not exist"):
        open_checked(tmp_path / "nope.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(DataError, match="not a probe file"):
        open_checked(tmp_path / "text.h5")


def test_without_targets_y_is_none(tmp_path):
    path = _write(tmp_path / "n.h5", with_target=False)
    with probe.open(path) as f:
        assert all(y is None for _, y in f.loader("l/output", batch_size=50))


def test_kinds_and_require(path):
    with probe.open(path) as f:
        assert f.kinds("l") == ["output"] and f.kinds("nope") == []
        assert f.require("l/output").shape == (N, 3)
        with pytest.raises(ConfigError, match=r"'hooks=\[forward,backward\]'") as err:
            f.require("l/grad_output")
        assert "'layers=[l]'" in str(err.value)
        with pytest.raises(KeyError):
            f.loader("l/input")


def test_real_run_streams_what_it_stored(make_cfg, tmp_path):
    path = probe.run(make_cfg("model=resnet18", "layers=[layer1]", "reduce=mean"))
    with probe.open(path) as f:
        x, y = next(iter(f.loader("layer1/output", batch_size=64)))
        np.testing.assert_array_equal(x.numpy(), f["layer1/output"][:])
        np.testing.assert_array_equal(y.numpy(), f.target)
