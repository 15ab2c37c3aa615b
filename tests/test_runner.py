"""probe.run end to end on tiny inputs: layout, re-runs, refusals, and bad input."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError, DeviceError, OutputError, ProbeError
from probe.file.format import partial_path
from tests.conftest import TINY_NET, assert_same_datasets, interrupt_after, no_h5_files


def test_layout_and_attrs(make_cfg):
    cfg = make_cfg("model=resnet18", "layers=[layer4,fc]", "hooks=[forward,forward_pre]")
    path = probe.run(cfg)
    with h5py.File(path, "r") as f:
        assert f.attrs["complete"] and f.attrs["num_samples"] == 6
        assert "model:" in f.attrs["config"] and f.attrs["probe_version"] == probe.__version__
        assert {"torch_version", "created"} <= set(f.attrs)
        assert f["index"].dtype == np.int64 and f["target"].dtype == np.int64
        assert f["layer4/output"].shape == (6, 512, 1, 1)
        assert f["layer4/input"].shape == (6, 256, 2, 2)
        assert f["fc/output"].shape == (6, 1000)
        assert f["layer4/output"].chunks[0] <= 6  # chunked along rows, never past the run
        attrs = dict(f["layer4/input"].attrs)
        dims = list(attrs.pop("dims"))  # the axis names, for readers without probe
        assert attrs == {"layer": "layer4", "hook": "forward_pre", "kind": "input",
                         "reduce": "none", "dtype": "float32"}
        assert dims == ["sample", "channel", "height", "width"]
        assert list(f["fc/output"].attrs["dims"]) == ["sample", "feature"]
        assert list(f["index"].attrs["dims"]) == ["sample"]
        targets = [probe.data.images.SyntheticImages(6, 32)[i][1] for i in range(6)]
        np.testing.assert_array_equal(f["target"][:], targets)
    assert not partial_path(path).exists()


def test_float16_and_reduce(make_cfg, tmp_path):
    full = probe.run(make_cfg("model=resnet18", "layers=[layer3]"))
    half = probe.run(make_cfg("model=resnet18", "layers=[layer3]", "output.dtype=float16",
                              "reduce=mean", output=tmp_path / "half.h5"))
    with h5py.File(full, "r") as a, h5py.File(half, "r") as b:
        assert b["layer3/output"].dtype == np.float16
        assert b["layer3/output"].attrs["reduce"] == "mean"
        np.testing.assert_allclose(b["layer3/output"][:], a["layer3/output"][:].mean((2, 3)),
                                   rtol=2e-3, atol=2e-3)


def test_reduce_by_layer(make_cfg, tmp_path):
    full = probe.run(make_cfg("model=resnet18", "layers=[layer3,layer4]"))
    mixed = probe.run(make_cfg("model=resnet18", "layers=[layer3,layer4]", "reduce=mean",
                               "reduce_by_layer={layer4:none}", output=tmp_path / "mixed.h5"))
    with h5py.File(full, "r") as a, h5py.File(mixed, "r") as b:
        assert b["layer3/output"].attrs["reduce"] == "mean"
        assert b["layer4/output"].attrs["reduce"] == "none"
        np.testing.assert_allclose(b["layer3/output"][:], a["layer3/output"][:].mean((2, 3)),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(b["layer4/output"][:], a["layer4/output"][:])


@pytest.mark.parametrize("compression", ["lzf", "gzip", "zstd"])
def test_compression_keeps_values(make_cfg, tmp_path, compression):
    if compression == "zstd":
        pytest.importorskip("hdf5plugin")  # the `zstd` extra; part of the `test` extra
    plain = probe.run(make_cfg("model=resnet18", "layers=[layer2]"))
    packed = probe.run(make_cfg("model=resnet18", "layers=[layer2]",
                                f"output.compression={compression}",
                                output=tmp_path / f"{compression}.h5"))
    with h5py.File(plain, "r") as a, h5py.File(packed, "r") as b:
        if compression != "zstd":  # h5py names only its built-in filters
            assert b["layer2/output"].compression == compression
        assert b["layer2/output"].id.get_create_plist().get_nfilters() == 1
        np.testing.assert_array_equal(a["layer2/output"][:], b["layer2/output"][:])


def test_same_config_again_does_nothing(make_cfg):
    path = probe.run(make_cfg("model=resnet18", "layers=[fc]"))
    before = path.stat().st_mtime_ns
    # batch_size does not change what is stored, so the finished file still counts
    assert probe.run(make_cfg("model=resnet18", "layers=[fc]", "batch_size=2")) == path
    assert path.stat().st_mtime_ns == before


def test_other_config_is_refused_then_overwritten(make_cfg):
    path = probe.run(make_cfg("model=resnet18", "layers=[fc]"))
    content = path.read_bytes()
    with pytest.raises(OutputError, match="differs in: layers"):
        probe.run(make_cfg("model=resnet18", "layers=[layer4]"))
    assert path.read_bytes() == content
    probe.run(make_cfg("model=resnet18", "layers=[layer4]", "output.overwrite=true"))
    with h5py.File(path, "r") as f:
        assert list(f) == ["index", "layer4", "target"]


def test_limit_and_shards_partition_the_samples(make_cfg, tmp_path):
    rows = []
    for index in range(2):
        path = probe.run(make_cfg("model=resnet18", "layers=[fc]", "limit=5", "shard.count=2",
                                  f"shard.index={index}", output=tmp_path / f"s{index}.h5"))
        with probe.open(path) as f:
            rows.append(f.index.tolist())
            assert f.attrs["shard_index"] == index
    assert rows == [[0, 2, 4], [1, 3]]


def test_resume_after_committed_rows_equals_a_whole_run(make_cfg, tmp_path, monkeypatch):
    whole = probe.run(make_cfg("model=resnet18", "layers=[layer4]", "batch_size=2",
                               output=tmp_path / "whole.h5"))
    target = tmp_path / "resumed.h5"
    cfg = make_cfg("model=resnet18", "layers=[layer4]", "batch_size=2", output=target)

    interrupt_after(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    with probe.open(target, allow_partial=True) as f:
        assert f.num_rows == 4 and not f.complete
    with pytest.raises(OutputError, match="not finished"):
        probe.open(target)
    probe.run(cfg)
    assert_same_datasets(whole, target, ("index", "target", "layer4/output"))


@pytest.mark.parametrize("overrides, error, message", [
    (["model=torchvision", "model.name=vgg61", "layers=[x]"], ConfigError, "vgg16"),
    (["model=torchvision", "layers=[x]"], ConfigError, "model.name"),
    (["model=resnet18", "model.weights=IMAGENET9K", "layers=[fc]"], ConfigError, "IMAGENET1K_V1"),
    (["model=resnet18", "model.weights=/nope/w.pt", "layers=[fc]"], DataError, "/nope/w.pt"),
    (["model=resnet18", "layers=[layer5]"], ConfigError, "layer4"),
    (["model=resnet18", "layers=[layer9.*]"], ConfigError, "python -m probe.layers"),
    (["model=resnet18", "layers=[]"], ConfigError, "layers is empty"),
    (["model=resnet18", "layers=[fc]", "reduce_by_layer={layer4:none}"], ConfigError,
     "reduce_by_layer names 'layer4'"),
    (["model=resnet18", "layers=[fc]", "reduce_by_layer={fc:avg}"], ConfigError, "'avg'"),
    (["model=resnet18", "layers=[fc]", "batch_size=0"], ConfigError, "batch_size=0"),
    (["model=resnet18", "layers=[fc]", "limit=0"], ConfigError, "limit=0"),
    (["model=resnet18", "layers=[fc]", "shard.index=2", "shard.count=2"], ConfigError, "shard"),
    (["model=resnet18", "layers=[fc]", "device=cuda:7"], DeviceError, "cuda:7"),
    (["model=resnet18", "layers=[fc]", "device=tpu"], ConfigError, "tpu"),
    (["model=resnet18", "layers=[fc]", "dataset=imagefolder", "dataset.root=/nope"],
     DataError, "/nope"),
    (["model=resnet18", "layers=[fc]", "dataset=cifar10", "dataset.root=/nope"],
     DataError, "dataset.download=true"),
    (["model=resnet18", "layers=[fc]", "output.compression=gzip", "output.compression_level=12"],
     ConfigError, "out of range for gzip: use 0 to 9"),
    (["model=resnet18", "layers=[fc]", "output.compression=lzf", "output.compression_level=3"],
     ConfigError, "takes no level"),
    (["model=resnet18", "layers=[fc]", "+batchsize=8"], ConfigError, "did you mean batch_size"),
    (["model=resnet18", "layers=[fc]", "+output.dtyp=float16"], ConfigError,
     "output.dtyp is not a probe config key; did you mean output.dtype"),
])
def test_bad_input_is_one_clear_error_and_no_file(make_cfg, tmp_path, overrides, error,
                                                  message):
    with pytest.raises(error, match=message.replace(".", r"\.").replace("*", r"\*")) as info:
        probe.run(make_cfg(*overrides))
    assert isinstance(info.value, ProbeError)
    assert "\n" not in str(info.value)
    assert no_h5_files(tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_is_an_error_without_cuda(make_cfg, tmp_path):
    with pytest.raises(DeviceError, match="device=cpu"):
        probe.run(make_cfg("model=resnet18", "layers=[fc]", "device=cuda"))
    assert no_h5_files(tmp_path)


def test_unwritable_output_directory(make_cfg, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OutputError, match="cannot write to the output directory"):
        probe.run(make_cfg("model=resnet18", "layers=[fc]", output=blocker / "out" / "f.h5"))


def test_output_path_is_required_outside_hydra(make_cfg):
    cfg = make_cfg("model=resnet18", "layers=[fc]")
    cfg.output.path = None
    with pytest.raises(OutputError, match="output.path"):
        probe.run(cfg)


@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_a_file_that_is_not_ours_is_refused(make_cfg, tmp_path, overwrite):
    # never replaced, and never a message that suggests output.overwrite=true for it
    path = tmp_path / "features.h5"
    path.write_text("something else")
    with pytest.raises(OutputError, match="not a readable probe file") as refused:
        probe.run(make_cfg("model=resnet18", "layers=[fc]", f"output.overwrite={overwrite}"))
    assert "overwrite" not in str(refused.value)
    assert path.read_text() == "something else"


def test_a_probe_file_cut_short_says_how_to_start_over(make_cfg, tmp_path):
    cfg = make_cfg(*TINY_NET, "layers=[fc]")
    path = probe.run(cfg)
    with path.open("r+b") as stream:
        stream.truncate(path.stat().st_size // 2)
    with pytest.raises(OutputError, match=r"is not a readable probe file \(another program's, "
                                          r"or a probe file cut short\).*delete it to start "
                                          r"over"):
        probe.run(cfg)


@pytest.mark.parametrize("value", ["false", "best-effort"])
def test_file_locking_can_be_relaxed(make_cfg, value):
    path = probe.run(make_cfg("model=resnet18", "layers=[fc]", f"output.file_locking={value}"))
    with probe.open(path) as f:
        assert f.num_rows == 6


def test_file_locking_rejects_other_values(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match="output.file_locking='sometimes'"):
        probe.run(make_cfg("model=resnet18", "layers=[fc]", "output.file_locking=sometimes"))
    assert no_h5_files(tmp_path)
