"""Capture kinds are data (probe.pipeline.kinds): a kind made and registered here, outside the
package, is stored by a normal run, its rows laid out as the batch's (a row per token of a
language model, a row per image), with no line of the hook object, the dry run, the per-key
transform or the plan changed for it; the core's interfaces stay as small as promised."""

from __future__ import annotations

import ast
import re

import h5py
import numpy as np
import pytest

import probe
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.pipeline.kinds import CaptureKind, hooked, register
from tests.conftest import REPO, TINY_NET


class RowNorm(CaptureKind):
    """The norm of each output row (over its last axis): (B, ..., 1)."""

    def attach(self, target, keep):
        return hooked(module.register_forward_hook(
            lambda _, args, out, layer=layer: keep(layer, out.norm(dim=-1, keepdim=True), None))
            for layer, module in target.modules.items())


ROW_NORM = register(RowNorm(hook="row_norm", kind="norm"))


def test_a_kind_registered_outside_the_package_is_stored_a_row_per_token(make_cfg, tiny_lm,
                                                                         tmp_path):
    from tests.tiny_text import documents, write_jsonl

    corpus = write_jsonl(tmp_path / "d.jsonl", documents(5, low=2, high=9))
    path = probe.run(make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                              f"dataset.path={corpus}", "batch_size=2",
                              "layers=[transformer.h.0.mlp]", "hooks=[forward,row_norm]"))
    with h5py.File(path) as f:
        outputs, norms = f["transformer.h.0.mlp/output"][:], f["transformer.h.0.mlp/norm"]
        assert norms.shape == (len(outputs), 1)  # a row per real token, padding left out
        np.testing.assert_allclose(norms[:, 0], np.linalg.norm(outputs, axis=1), rtol=1e-5)
        assert (norms.attrs["hook"], norms.attrs["kind"]) == ("row_norm", "norm")
        assert list(norms.attrs["dims"]) == ["token", "feature"]
        assert list(f.attrs["hooks"]) == ["forward", "row_norm"]


def test_a_kind_registered_outside_the_package_is_stored_a_row_per_image(make_cfg):
    path = probe.run(make_cfg(*TINY_NET, "layers=[fc]", "hooks=[row_norm,forward]"))
    with h5py.File(path) as f:
        assert f["fc/norm"].shape == (6, 1)
        np.testing.assert_allclose(f["fc/norm"][:, 0],
                                   np.linalg.norm(f["fc/output"][:], axis=1), rtol=1e-5)


def test_two_kinds_with_one_name_is_an_error_and_the_same_kind_twice_is_not():
    assert register(RowNorm(hook="row_norm", kind="norm")) == ROW_NORM
    with pytest.raises(ValueError, match="two capture kinds are named 'row_norm'"):
        register(RowNorm(hook="row_norm", kind="other"))
    with pytest.raises(ValueError, match="never ends in _<digits>"):
        register(RowNorm(hook="numbered", kind="norm_2"))


def test_an_unknown_kind_is_one_line_naming_the_known_ones(make_cfg, tmp_path):
    with pytest.raises(ConfigError, match=r"hook 'norms' is unknown; use any of forward, "
                                          r"forward_pre, .*row_norm$"):
        probe.run(make_cfg(*TINY_NET, "layers=[fc]", "hooks=[norms]"))
    assert not list(tmp_path.glob("*.h5*"))


# -- the interfaces stay small, and the core names no kind ---------------------------------

_CORE = ["hooks", "dryrun", "keys", "plan"]
_KIND_WORDS = re.compile(r"attention|pattern|generat|answer|joined", re.I)


def _methods(cls: str, module: str) -> list[str]:
    tree = ast.parse((REPO / "probe" / "pipeline" / f"{module}.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return [n.name for n in body if isinstance(n, ast.FunctionDef)]


def test_the_core_names_no_capture_kind_and_no_way_of_computing_a_batch():
    words = {m: _KIND_WORDS.findall((REPO / "probe" / "pipeline" / f"{m}.py").read_text())
             for m in _CORE}
    assert sum(map(len, words.values())) <= 8, words


def test_the_hook_object_and_the_row_layout_stay_small():
    assert len(_methods("Capture", "hooks")) <= 15, _methods("Capture", "hooks")
    members = [n for n in {*vars(RowLayout), *RowLayout.__annotations__}
               if not n.startswith("_")]
    # bounded_lengths came with the decoder rows of encoder-decoders, bounded by their own offsets
    assert len(members) <= 10, sorted(members)


def test_nothing_outside_the_hook_objects_module_sets_its_state():
    # an assignment to an attribute of a capture (capture.x = ..., self.capture.x = ...)
    found = []
    for path in (REPO / "probe").rglob("*.py"):
        if path.name == "hooks.py" and path.parent.name == "pipeline":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)) and re.search(
                        r"\bcap(ture)?\b", ast.unparse(target.value)):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
