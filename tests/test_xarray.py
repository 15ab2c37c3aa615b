"""probe.open(path).to_xarray(key): a DataArray with the file's dims and its rows' coords that
reads nothing until indexed, and then the values h5py reads."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import pytest

import probe
from probe.errors import ConfigError
from probe.file import dataarray
from tests.test_export import CONV, FC, image_file, token_file

xr = pytest.importorskip("xarray")


@pytest.fixture
def reads(monkeypatch):
    """Every read the arrays make, as the keys they read with."""
    seen = []
    original = dataarray._Lazy.__getitem__

    def counted(self, key):
        seen.append(key)
        return original(self, key)

    monkeypatch.setattr(dataarray._Lazy, "__getitem__", counted)
    return seen


def test_dims_and_coords_of_sample_rows(tmp_path, reads):
    path = image_file(tmp_path / "a.h5", files=True)
    with probe.open(path) as f:
        x = f.to_xarray(CONV)
        repr(x), x.isel(sample=[3, 1]), x.sel(channel=slice(1, 2))
        assert not reads  # made, shown and indexed: nothing read
        assert x.dims == ("sample", "channel", "height", "width") and x.name == CONV
        assert set(x.coords) == {"index", "target", "file"}
        assert x.attrs["dtype"] == "float32" and "dims" not in x.attrs
        np.testing.assert_array_equal(x.values, f[CONV][:])
        np.testing.assert_array_equal(x.index.values, f.index)
        np.testing.assert_array_equal(x.target.values, f.target)
        assert list(x.file.values) == list(f["file"].asstr()[:])
        assert f.to_xarray(FC).dims == ("sample", "feature")


@pytest.mark.parametrize("pick", [
    lambda x: x.isel(sample=[7, 2, 2, 0]),            # unsorted, repeated
    lambda x: x.isel(sample=slice(None, None, -2)),   # backwards
    lambda x: x.isel(sample=-1, channel=[2, 0]),
    lambda x: x.where(x.target == 1, drop=True),
    lambda x: x[2:5, 1],
])
def test_indexing_reads_what_numpy_would(pick, tmp_path):
    path = image_file(tmp_path / "a.h5")
    with probe.open(path) as f:
        x = f.to_xarray(CONV)
        memory = xr.DataArray(f[CONV][:], dims=x.dims,
                              coords={"index": ("sample", f.index),
                                      "target": ("sample", f.target)})
        np.testing.assert_array_equal(pick(x).values, pick(memory).values)
        np.testing.assert_array_equal(pick(x).index.values, pick(memory).index.values)


def test_token_rows_have_their_samples_coords(tmp_path, reads):
    path = token_file(tmp_path / "t.h5")
    with probe.open(path) as f:
        x = f.to_xarray("block.1/output")
        assert not reads
        assert x.dims == ("token", "feature")
        assert set(x.coords) == {"sample", "index", "input_ids", "positions", "document"}
        offsets = f.offsets
        samples = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        np.testing.assert_array_equal(x.sample.values, samples)
        np.testing.assert_array_equal(x.index.values, f.index[samples])
        np.testing.assert_array_equal(x.document.values, f["document"][:])
        picked = x.isel(token=[40, 3, 17])
        np.testing.assert_array_equal(picked.sample.values, samples[[40, 3, 17]])
        np.testing.assert_array_equal(picked.values, f["block.1/output"][:][[40, 3, 17]])
        third = x.where(x.sample == 2, drop=True)
        np.testing.assert_array_equal(third.values, f.rows_of("block.1/output", row=2))


def test_bfloat16_reads_as_float32_and_a_copy_shares_the_file(tmp_path):
    path = image_file(tmp_path / "a.h5", dtype="bfloat16")
    with probe.open(path) as f:
        x = f.to_xarray(FC)
        assert x.dtype == np.float32
        np.testing.assert_array_equal(x.copy(deep=True).values, f[FC][:])
        loaded = x.load()
    np.testing.assert_array_equal(loaded.values, x.values)  # loaded: the file may close


def test_a_partial_file_shows_its_committed_rows(tmp_path):
    path = image_file(tmp_path / "a.h5", rows=10, finish=False)
    with h5py.File(tmp_path / "a.h5.partial", "r+") as raw:  # as if cut after 6 rows
        raw.attrs["num_committed"] = 6
    with probe.open(path, allow_partial=True) as f:
        x = f.to_xarray(CONV)
        assert x.sizes["sample"] == f.num_rows == 6 and len(f[CONV]) == 10
        np.testing.assert_array_equal(x.values, f[CONV][:6])
        np.testing.assert_array_equal(x.index.values, f.index)


def test_unknown_keys_and_a_missing_xarray(tmp_path, monkeypatch):
    path = image_file(tmp_path / "a.h5")
    with probe.open(path) as f:
        with pytest.raises(ConfigError, match="'layer9/output' is not in"):
            f.to_xarray("layer9/output")
        monkeypatch.setitem(sys.modules, "xarray", None)
        monkeypatch.delitem(sys.modules, "probe.file.dataarray")
        with pytest.raises(ImportError, match=r"pip install 'probe\[export\]'"):
            f.to_xarray(CONV)


def test_vision_language_rows_have_their_patch_on_the_grid(tmp_path, reads):
    path = token_file(tmp_path / "v.h5")
    with h5py.File(path, "r+") as f:  # as a vision-language run stores them: -1 for text
        rows = len(f["block.1/output"])
        patch = np.full((rows, 2), -1, dtype=np.int32)
        patch[5:14] = np.stack(np.divmod(np.arange(9), 3), 1)
        f.create_dataset("patch", data=patch)
    with probe.open(path) as f:
        x = f.to_xarray("block.1/output")
        assert not reads
        np.testing.assert_array_equal(x.patch_row.values, patch[:, 0])
        np.testing.assert_array_equal(x.patch_column.values, patch[:, 1])
        picked = x.isel(token=[9, 2, 13])
        np.testing.assert_array_equal(picked.patch_column.values, patch[[9, 2, 13], 1])
        image = x.where(x.patch_row >= 0, drop=True)
        np.testing.assert_array_equal(image.values, f["block.1/output"][5:14])
