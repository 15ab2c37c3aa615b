"""The files that probe writes are what 0.2.0 wrote, value for value and attr for attr: six
runs (images with gradients, text with every hook, a generation, a vision-language model
generating, attention patterns of text and of a ViT) against the goldens that 0.2.0 wrote
(tests/same_files.py); the one addition since, the fidelity attrs of compact (float16) rows, is
set apart.

Floats are compared bit for bit where this machine's CPU has the capability that the goldens
were made with and no AMX tiles (torch's kernels differ between instruction sets); elsewhere
to 1e-5."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from tests.same_files import CASES, run_case, snapshot

pytest.importorskip("transformers")
GOLDEN = REPO / "tests" / "golden"


def _has_amx() -> bool:
    # oneDNN runs matrix products on AMX tiles where the CPU has them (Sapphire Rapids), which
    # round otherwise than the AVX512 kernels that the goldens were made with
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("name", list(CASES))
def test_the_file_is_the_one_0_2_0_wrote(name, tmp_path):
    arrays, meta = snapshot(run_case(name, tmp_path), tmp_path)
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    exact = golden.pop("cpu_capability") == torch.backends.cpu.get_cpu_capability() \
        and not _has_amx()
    assert meta["root"] == golden["root"]
    assert list(meta["datasets"]) == list(golden["datasets"])  # the same, in the same order
    for key, said in golden["datasets"].items():
        # added since 0.2.0: compact rows (float16 here) say what they lost against float32
        attrs = meta["datasets"][key]["attrs"]
        added = {name for name in attrs if name.startswith("fidelity_")}
        assert added in (set(), {"fidelity_rows", "fidelity_mean_relative_error",
                                 "fidelity_max_relative_error", "fidelity_min_cosine",
                                 "fidelity_cka"}), key
        attrs = {name: value for name, value in attrs.items() if name not in added}
        assert {**meta["datasets"][key], "attrs": attrs} == said, key
    with np.load(GOLDEN / f"{name}.npz", allow_pickle=False) as stored:
        expected = {key.replace("|", "/"): stored[key] for key in stored.files}
    assert sorted(arrays) == sorted(expected)
    for key, values in expected.items():
        if exact or values.dtype.kind not in "fc":
            assert arrays[key].tobytes() == values.tobytes(), key
        else:
            np.testing.assert_allclose(arrays[key], values, rtol=1e-5, atol=1e-6, err_msg=key)
