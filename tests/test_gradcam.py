"""Grad-CAM: the stored maps equal a direct computation from the stored output and gradient."""

from __future__ import annotations

import hashlib
import logging
import shutil

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.analyses.gradcam import gradcam, save_montage, write_gradcam
from probe.config.compose import compose
from probe.errors import ConfigError
from tests.conftest import cli

PNG = b"\x89PNG\r\n\x1a\n"


def _run(path, *overrides):
    cfg = compose(["model=resnet18", "hooks=[forward,backward]",
                   "dataset.num_samples=10", "batch_size=4",
                   f"output.path={path}", *overrides])
    return probe.run(cfg)


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """resnet18's layer3 output and gradient, (10, 256, 4, 4), for 10 synthetic 64 px images."""
    return _run(tmp_path_factory.mktemp("gradcam") / "features.h5", "layers=[layer3]",
                "dataset.image_size=64")


def _direct(path, layer="layer3"):
    # Grad-CAM by hand, in float64, from the file as plain h5py reads it
    with h5py.File(path, "r") as f:
        acts = f[f"{layer}/output"][:].astype(np.float64)
        grads = f[f"{layer}/grad_output"][:].astype(np.float64)
    weights = grads.mean(axis=(2, 3))
    return np.maximum((weights[:, :, None, None] * acts).sum(axis=1), 0)


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("normalize", [False, True])
def test_stored_maps_equal_a_direct_computation(features, tmp_path, normalize):
    before = _digest(features)
    out = write_gradcam(features, "layer3", tmp_path / "cam.h5", normalize=normalize,
                        block_rows=3)  # blocks of whole chunks: several of them
    expected = _direct(features)
    assert expected.shape == (10, 4, 4) and (expected > 0).any()  # not trivially all zeros
    if normalize:
        expected = expected / expected.max(axis=(1, 2), keepdims=True)
    with probe.open(out) as f:
        np.testing.assert_allclose(f["layer3/gradcam"][:], expected, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(f.index, np.arange(10))
        with h5py.File(features, "r") as source:
            np.testing.assert_array_equal(f.target, source["target"][:])
        assert f.config.dataset.image_size == 64  # the run's config travels with the maps
        assert f["layer3/gradcam"].attrs["normalize"] == normalize
    assert _digest(features) == before  # the input file is only read
    assert not (tmp_path / "cam.h5.partial").exists()


def test_gradcam_function_numpy_and_torch():
    rng = np.random.default_rng(0)
    acts, grads = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 5, 3, 4))
    maps = gradcam(acts, grads)
    assert isinstance(maps, np.ndarray) and maps.shape == (2, 3, 4) and maps.min() >= 0
    expected = np.maximum(np.einsum("nc,nchw->nhw", grads.mean(axis=(2, 3)), acts), 0)
    np.testing.assert_allclose(maps, expected, rtol=1e-5, atol=1e-6)
    as_torch = gradcam(torch.from_numpy(acts), torch.from_numpy(grads), normalize=True)
    assert isinstance(as_torch, torch.Tensor)
    np.testing.assert_allclose(as_torch.amax(dim=(1, 2)).numpy(), 1.0, rtol=1e-6)
    assert not gradcam(acts, np.zeros_like(grads), normalize=True).any()  # 0 stays 0, no NaN
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        gradcam(acts[:, :, 0], grads[:, :, 0])


def test_montage_over_the_rebuilt_images(features, tmp_path, caplog):
    out = write_gradcam(features, output=tmp_path / "cam.h5")  # the only layer with both
    with caplog.at_level(logging.WARNING, logger="probe.analyses.gradcam"):
        png = save_montage(out, num_images=4)
    assert not caplog.records  # the synthetic dataset was rebuilt from the stored config
    assert png == tmp_path / "cam.png" and png.read_bytes()[:8] == PNG
    assert png.stat().st_size > 10_000


def test_montage_without_the_dataset_draws_maps_alone(features, tmp_path, caplog):
    out = write_gradcam(features, "layer3", tmp_path / "cam.h5")
    with h5py.File(out, "r+") as f:  # a dataset that cannot be rebuilt here
        f.attrs["config"] = str(f.attrs["config"]).replace("probe.data.images.SyntheticImages",
                                                           "mylab.gone.Scans")
    with caplog.at_level(logging.WARNING, logger="probe.analyses.gradcam"):
        png = save_montage(out, num_images=3, png=tmp_path / "alone.png")
    assert "drawing the maps alone" in caplog.text
    assert png.read_bytes()[:8] == PNG


def test_errors_say_how_to_get_a_usable_file(features, tmp_path):
    forward_only = tmp_path / "forward.h5"
    shutil.copy(features, forward_only)
    with h5py.File(forward_only, "r+") as f:
        del f["layer3/grad_output"]
    with pytest.raises(ConfigError, match=r"no layer3/grad_output.*'hooks=\[forward,backward\]'"):
        write_gradcam(forward_only, "layer3")
    with pytest.raises(ConfigError, match=r"no layer4/output or layer4/grad_output"):
        write_gradcam(features, "layer4")
    with pytest.raises(ConfigError, match="is the input file"):
        write_gradcam(features, "layer3", output=features)
    assert not list(tmp_path.glob("*gradcam*"))


def test_cli_writes_maps_and_montage_next_to_the_file(features, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    copy = tmp_path / "run" / "features.h5"
    copy.parent.mkdir()
    shutil.copy(features, copy)
    result = cli(f"file={copy}", "layer=layer3", "num_images=3", "normalize=true",
                     cwd=tmp_path, module="probe.gradcam")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in copy.parent.iterdir()) == [
        "features.h5", "features_gradcam.h5", "features_gradcam.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no Hydra folders, no logs
    with h5py.File(copy.parent / "features_gradcam.h5", "r") as f:
        maps = f["layer3/gradcam"][:]
    np.testing.assert_allclose(maps.max(axis=(1, 2)), 1.0, rtol=1e-6)


def test_cli_refuses_pooled_rows_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pooled = _run(tmp_path / "pooled.h5", "layers=[layer4]", "reduce=mean",
                  "dataset.image_size=32", "dataset.num_samples=2")
    result = cli(f"file={pooled}", "layer=layer4", cwd=tmp_path, module="probe.gradcam")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("probe: error:")]
    assert len(errors) == 1 and "(N, C, H, W)" in errors[0] and "reduce=none" in errors[0]
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("*gradcam*"))
