"""Readers other than h5py: Debian's hdf5-tools (h5dump, h5ls) use the HDF5 C library that
MATLAB, Julia and R use. Finished files, gzip-compressed ones, bfloat16 bits, strings and merged
files read there as in h5py; lzf, which only h5py decodes, does not (as the README says)."""

from __future__ import annotations

import re
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import probe
from probe.file.merge import merge
from tests.conftest import TINY_NET

pytestmark = pytest.mark.skipif(shutil.which("h5dump") is None,
                                reason="needs Debian's hdf5-tools (h5dump, h5ls)")

RUN = [*TINY_NET, "layers=[features.1,fc]", "dataset.num_samples=5", "batch_size=2"]


def _dumped(path, dataset: str, cwd=None) -> np.ndarray:
    # every value h5dump prints for a dataset, in order, at float32's full precision
    done = subprocess.run(["h5dump", "-d", dataset, "-m", "%.9g", "-w", "0", str(path)],
                          capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stdout[-500:] + done.stderr[-500:]
    data = done.stdout.split("DATA {", 1)[1].split("}", 1)[0]
    values = [v for line in data.splitlines() if "):" in line
              for v in line.split("):", 1)[1].replace(",", " ").split()]
    return np.array([float(v) for v in values])  # 9 digits: every float32, exactly


@pytest.mark.parametrize("extra", [[], ["output.compression=gzip"],
                                   ["output.dtype=bfloat16"]])
def test_h5dump_reads_the_values_h5py_reads(make_cfg, extra):
    path = probe.run(make_cfg(*RUN, *extra))
    with h5py.File(path, "r") as f:
        for key in ("fc/output", "features.1/output", "index"):
            want = f[key][:].reshape(-1)
            got = _dumped(path, f"/{key}").astype(want.dtype)
            np.testing.assert_array_equal(got, want, err_msg=key)


def test_h5ls_lists_every_dataset(make_cfg):
    path = probe.run(make_cfg(*RUN))
    listed = subprocess.run(["h5ls", "-r", str(path)], capture_output=True, text=True,
                            check=True).stdout
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name)
                     if isinstance(obj, h5py.Dataset) else None)
    assert sorted(names) == sorted(re.findall(r"^/(\S+)\s+Dataset", listed, re.M))


def test_a_merged_file_reads_from_any_folder(make_cfg, tmp_path):
    shards = [probe.run(make_cfg(*RUN, "shard.count=2", f"shard.index={k}",
                                 output=tmp_path / "run" / f"s{k}" / "features.h5"))
              for k in range(2)]
    merged = merge(tmp_path / "run" / "merged.h5", shards)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with h5py.File(merged, "r") as f:
        want = f["fc/output"][:].reshape(-1)
    got = _dumped(merged, "/fc/output", cwd=elsewhere).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_file_names_of_an_image_folder_are_strings(make_cfg, tmp_path):
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "img" / label).mkdir(parents=True)
        Image.new("RGB", (36, 36), "red").save(tmp_path / "img" / label / "x.png")
    path = probe.run(make_cfg(*TINY_NET, "layers=[fc]", "dataset=imagefolder",
                              f"dataset.root={tmp_path / 'img'}", "dataset.image_size=32"))
    shown = subprocess.run(["h5dump", "-d", "/file", str(path)], capture_output=True,
                           text=True, check=True).stdout
    assert '"a/x.png"' in shown and '"b/x.png"' in shown


def test_lzf_is_for_h5py_alone(make_cfg):
    # a compressible dataset (a ReLU's zeros): the C tools cannot decode it
    path = probe.run(make_cfg(*RUN, "output.compression=lzf"))
    done = subprocess.run(["h5dump", "-d", "/features.1/output", str(path)],
                          capture_output=True, text=True)
    assert done.returncode != 0 or "unable to print data" in done.stdout + done.stderr
    with probe.open(path) as f:  # h5py reads it
        assert f["features.1/output"][:].shape == (5, 8, 32, 32)


def test_float8_rows_decode_from_what_h5dump_prints(make_cfg):
    # the bytes, the scales and the decode table (an attr) as the C library reads them: one
    # lookup and one multiply give probe.open's floats
    path = probe.run(make_cfg(*RUN, "output.dtype=float8"))
    data = _dumped(path, "/fc/output").astype(np.int64).reshape(5, -1)
    scale = _dumped(path, "/fc/output_scale").astype(np.float32)
    done = subprocess.run(["h5dump", "-a", "/fc/output/decode_table", "-m", "%.9g", "-w", "0",
                           str(path)], capture_output=True, text=True, check=True).stdout
    table = np.array([float(v) for line in done.split("DATA {", 1)[1].splitlines()
                      if "):" in line
                      for v in line.split("):", 1)[1].replace(",", " ").split()],
                     dtype=np.float32)
    assert len(table) == 256
    with probe.open(path) as f:
        np.testing.assert_array_equal(table[data] * scale[:, None], f["fc/output"][:])
