"""The CUDA path: device copies into pinned buffers, taken before later in-place ops, and the
same values as on the CPU. Marked gpu (deselected by default); run with ``pytest -m gpu`` on a
machine with CUDA (benchmarks/gpu_check.sh does that and the GPU benchmark)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from tests.conftest import hook_count, load_model, model_overrides

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 would make the GPU's convolutions differ from the CPU's by ~1e-3."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("hooks", ["[forward]", "[forward,backward,backward_input]"])
def test_a_cuda_run_equals_the_cpu_run(make_cfg, checkpoints, tmp_path, hooks):
    common = [*model_overrides("vgg16", checkpoints["vgg16"]),
              "layers=[features.0,features.28,classifier.3]", f"hooks={hooks}"]
    cpu = probe.run(make_cfg(*common, "device=cpu", output=tmp_path / "cpu.h5"))
    gpu = probe.run(make_cfg(*common, "device=cuda", output=tmp_path / "gpu.h5"))
    with h5py.File(cpu, "r") as a, h5py.File(gpu, "r") as b:
        assert sorted(a) == sorted(b)
        for layer in ("features.0", "features.28", "classifier.3"):
            for kind in a[layer]:
                want = a[f"{layer}/{kind}"][:]
                np.testing.assert_allclose(b[f"{layer}/{kind}"][:], want, rtol=1e-3,
                                           atol=1e-4 * np.abs(want).max(), err_msg=kind)


def test_cuda_copies_are_taken_before_the_inplace_relu(checkpoints):
    model = load_model("vgg16", checkpoints["vgg16"]).cuda()
    images = torch.randn(4, 3, 32, 32, device="cuda")
    with probe.attach(model, ["features.28"]) as cap, torch.inference_mode():
        model(images)
        values = cap.take()
        for event in cap.copied:
            event.synchronize()
    stored = values["features.28/output"]
    assert stored.is_pinned() and (stored < 0).any()
    with torch.inference_mode():
        want = model.features[:29](images).cpu()
    torch.testing.assert_close(stored, want)
    assert hook_count(model) == 0


def test_float16_and_reduce_on_the_device(make_cfg, tmp_path):
    path = probe.run(make_cfg("model=resnet18", "layers=[layer3]", "device=cuda", "reduce=max",
                              "output.dtype=float16"))
    with h5py.File(path, "r") as f:
        assert f["layer3/output"].dtype == np.float16 and f["layer3/output"].shape == (6, 256)
