"""Store details: chunk shapes, config comparison, reading back."""

from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.config.schema import differing_keys
from probe.errors import OutputError
from probe.file.format import DatasetSpec
from probe.file.store import _CHUNK_BYTES, Store, chunk_shape, filter_options


@pytest.mark.parametrize("row_shape, max_rows", [
    ((512, 14, 14), 10_000), ((1000,), 10_000), ((64, 224, 224), 100), ((7,), 3), ((), 50),
])
def test_chunks_are_about_2_mib_and_never_longer_than_the_run(row_shape, max_rows):
    chunks = chunk_shape(row_shape, 4, max_rows)
    size = 4
    for dim in chunks:
        size *= dim
    assert chunks[0] <= max_rows and len(chunks) == len(row_shape) + 1
    assert size <= _CHUNK_BYTES
    row_bytes = 4 * size // (4 * chunks[0]) if chunks[0] else 0
    if chunks[0] < max_rows and row_bytes * 2 <= _CHUNK_BYTES:
        assert size > _CHUNK_BYTES // 2  # rows are packed up to the target


@pytest.mark.parametrize("row_shape, max_rows, rows", [
    ((512,), 10_000, 32), ((512,), 20, 16), ((512, 14, 14), 100, 4), ((64, 224, 224), 9, 1),
])
def test_compressed_chunks_hold_a_power_of_two_rows(row_shape, max_rows, rows):
    assert chunk_shape(row_shape, 4, max_rows, compressed=True)[0] == rows


def test_differing_keys_ignore_settings_that_do_not_shape_values():
    a = {"model": {"name": "vgg16"}, "batch_size": 4, "output": {"path": "a", "dtype": "x"}}
    b = {"model": {"name": "vgg19"}, "batch_size": 8, "output": {"path": "b", "dtype": "y"}}
    assert differing_keys(a, b) == ["model.name", "output.dtype"]


def test_open_reads_a_finished_file(make_cfg):
    path = probe.run(make_cfg("model=resnet18", "layers=[layer4,fc]"))
    with probe.open(path) as f:
        assert f.features == ["fc/output", "layer4/output"] and f.num_rows == 6
        # a mapping of every dataset, as it looks
        assert "index" in f and "nope" not in f and len(f) == 4
        assert sorted(f.keys()) == ["fc/output", "index", "layer4/output", "target"]
        assert dict(f.items())["index"].shape == (6,)
        assert f["fc/output"][:2].shape == (2, 1000)
        assert f.config.model.name == "resnet18" and f.target.shape == (6,)
        with pytest.raises(KeyError, match="fc/output"):
            f["fc/input"]


def test_open_refuses_an_incomplete_file(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"complete": False, "num_committed": 2, "num_samples": 6, "config": ""})
    with pytest.raises(OutputError, match="2 of 6 rows"):
        probe.open(path)
    with probe.open(path, allow_partial=True) as f:
        assert f.num_rows == 2


def test_open_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        probe.open(tmp_path / "nothing.h5")


def _stored_committed_rows(dataset: h5py.Dataset, committed: int) -> dict[tuple, bytes]:
    """For each chunk that holds a committed row: its file offset and bytes as stored; for an
    uncompressed chunk only the bytes of its committed rows (later rows may still be added)."""
    rows, row_bytes = dataset.chunks[0], dataset.dtype.itemsize * math.prod(dataset.shape[1:])
    filtered = dataset.id.get_create_plist().get_nfilters() > 0
    stored = {}
    for i in range(dataset.id.get_num_chunks()):
        info = dataset.id.get_chunk_info(i)
        first = info.chunk_offset[0]
        if first < committed:
            _, raw = dataset.id.read_direct_chunk(info.chunk_offset)
            held = (min(committed, first + rows) - first) * row_bytes
            stored[info.chunk_offset] = (info.byte_offset, raw if filtered else raw[:held])
    return stored


@pytest.mark.parametrize("compression", ["none", "lzf", "gzip"])
def test_committed_rows_are_never_written_again(tmp_path, compression):
    # A SIGKILL while HDF5 rewrites a chunk could tear rows that were already committed (a
    # compressed chunk is rewritten whole, in place or after its space is freed), so the bytes
    # of committed rows must stay as they were stored.
    rows, batch = 61, 3  # neither divides a chunk
    store = Store(tmp_path / "f.h5", config_yaml="{}", num_rows=rows, has_target=False,
                  datasets={"x/output": DatasetSpec((40,), "float32")},
                  filters=filter_options(compression))
    values = torch.randn(rows, 40)
    before: dict[tuple, tuple[int, bytes]] = {}
    for start in range(0, rows, batch):
        stop = min(start + batch, rows)
        store.append(torch.arange(start, stop), None, {"x/output": values[start:stop]})
        store.commit()
        dataset = store._file["x/output"]
        now = _stored_committed_rows(dataset, store.num_committed)
        for chunk, (offset, raw) in before.items():
            assert now[chunk][0] == offset and now[chunk][1].startswith(raw), chunk
        before = now
        assert stop - store.num_committed < dataset.chunks[0] + batch  # durable soon after
    store.finish()
    with probe.open(tmp_path / "f.h5") as f:
        np.testing.assert_array_equal(f["x/output"][:], values.numpy())


def test_strings_written_after_the_last_commit_do_not_break_the_resume(tmp_path):
    # A kill after a batch's strings reached their chunk but before the heap that holds them
    # (or the dataset's new extent) did: the resumed run writes over those rows, and HDF5 frees
    # the values it replaces, so a dangling reference there failed every rerun (bad heap index).
    path, rows = tmp_path / "f.h5", 12
    names = np.array([f"class{i % 2}/{i}.png" for i in range(rows)], dtype=object)
    specs = {"file": DatasetSpec((), "str", compressible=False),
             "x/output": DatasetSpec((3,), "float32")}
    values = torch.randn(rows, 3)

    def open_store(resume_from=0):
        return Store(path, config_yaml="{}", num_rows=rows, has_target=False, datasets=specs,
                     resume_from=resume_from)

    def append(store, start, stop):
        store.append(torch.arange(start, stop), None,
                     {"file": names[start:stop], "x/output": values[start:stop]})

    store = open_store()
    append(store, 0, 4)
    store.commit()
    store.close()
    child = os.fork()
    if child == 0:  # resumes, writes four rows, dies before any flush
        store = open_store(resume_from=4)
        append(store, 4, 8)
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    with h5py.File(path.with_name("f.h5.partial"), "r", swmr=True) as f:  # the kill's trace
        _, raw = f["file"].id.read_direct_chunk((0,))
        assert len(f["file"]) == 4 and any(raw[4 * 16:8 * 16]), "no dangling reference left"
    store = open_store(resume_from=4)
    append(store, 4, rows)
    store.finish()
    with probe.open(path) as f:
        assert [name.decode() for name in f["file"][:]] == list(names)
        np.testing.assert_array_equal(f["x/output"][:], values.numpy())


def test_rows_of_two_bounds_resume_after_a_kill(tmp_path):
    """An encoder-decoder's encoder rows (/offsets) and decoder rows (/decoder_offsets) differ
    in count: each stream is truncated to the last commit and goes on from there."""
    from probe.file.format import DECODER_OFFSETS, OFFSETS

    specs = {"enc/output": DatasetSpec((2,), "float32", per_position=True),
             "dec/output": DatasetSpec((2,), "float32", per_position=True,
                                       bounds=DECODER_OFFSETS)}
    path = tmp_path / "r.h5"

    def put(store, first, source, target):
        values = {"enc/output": np.full((sum(source), 2), first, np.float32),
                  "dec/output": np.full((sum(target), 2), -first, np.float32)}
        store.append(np.arange(first, first + len(source)), None, values,
                     lengths={OFFSETS: np.array(source), DECODER_OFFSETS: np.array(target)})

    store = Store(path, config_yaml="x", num_rows=4, datasets=specs, has_target=False,
                  per_position=True)
    put(store, 0, [3, 1], [2, 5])
    store.commit()
    put(store, 2, [2], [1])  # written, never committed: a kill comes now
    store._file.close()
    store = Store(path, config_yaml="x", num_rows=4, datasets=specs, has_target=False,
                  per_position=True, resume_from=2)
    put(store, 2, [2, 2], [1, 3])
    store.finish()
    with h5py.File(path) as f:
        assert f["offsets"][:].tolist() == [0, 3, 4, 6, 8]
        assert f["decoder_offsets"][:].tolist() == [0, 2, 7, 8, 11]
        assert f["dec/output"].attrs["offsets"] == "decoder_offsets"
        assert f["enc/output"][:, 0].tolist() == [0] * 4 + [2] * 4
        assert f["dec/output"][:, 0].tolist() == [0] * 7 + [-2] * 4
