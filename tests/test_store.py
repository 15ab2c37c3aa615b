"""Store details: chunk shapes, config comparison, reading back."""

from __future__ import annotations

import h5py
import pytest

import probe
from probe.errors import OutputError
from probe.store import _CHUNK_BYTES, chunk_shape, differing_keys


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


def test_differing_keys_ignore_settings_that_do_not_shape_values():
    a = {"model": {"name": "vgg16"}, "batch_size": 4, "output": {"path": "a", "dtype": "x"}}
    b = {"model": {"name": "vgg19"}, "batch_size": 8, "output": {"path": "b", "dtype": "y"}}
    assert differing_keys(a, b) == ["model.name", "output.dtype"]


def test_open_reads_a_finished_file(make_cfg):
    path = probe.run(make_cfg("model=resnet18", "layers=[layer4,fc]"))
    with probe.open(path) as f:
        assert f.keys == ["fc/output", "layer4/output"] and f.num_rows == 6
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
