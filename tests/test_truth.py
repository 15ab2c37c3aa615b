"""What a new user of 0.2 found untrue, made true (issue 43): findings never overwrite findings,
files of two datasets are never paired unasked, a small run writes a small file whose size the
plan foresaw, a model that fails on padding fails before any file, and every refusal is one
line that quotes the user's own value."""

from __future__ import annotations

import json
import logging

import h5py
import numpy as np
import pytest

import probe
from probe.errors import ConfigError, DataError, OutputError, ProbeError
from tests.conftest import TINY_NET, cli, error_line, no_h5_files
from tests.test_compare import write_probe_file

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(tmp_path, fingerprints=({"length": 40}, {"length": 40})):
    rng = np.random.default_rng(0)
    paths = []
    for name, fingerprint in zip("ab", fingerprints, strict=True):
        path = write_probe_file(tmp_path / f"{name}.h5", np.arange(40),
                                {"x/output": rng.normal(size=(40, 6))})
        with h5py.File(path, "a") as f:
            f.attrs["data_fingerprint"] = json.dumps(fingerprint)
            f.attrs["config"] = f"dataset: {{_target_: mylab.Set{name.upper()}, path: {name}}}"
        paths.append(path)
    return paths


# -- findings never overwrite findings ----------------------------------------------------------

def test_compare_refuses_a_folder_of_earlier_findings_unless_told(tmp_path):
    a, b = _pair(tmp_path)
    out = tmp_path / "out"
    first = cli(f"file={a}", f"other={b}", f"out_dir={out}", "plot=false", cwd=tmp_path,
                module="probe.compare")
    assert first.returncode == 0, first.stderr
    table = (out / "similarity.csv").read_text()
    said = json.loads((out / "compared.json").read_text())
    assert (said["file"], said["other"], said["metric"]) == (str(a), str(b), "cka")
    again = cli(f"file={a}", "metric=rsa", f"out_dir={out}", cwd=tmp_path,
                module="probe.compare")
    line = error_line(again)
    assert f"out_dir={str(out)!r} holds earlier findings (compared.json, similarity.csv)" in line
    assert "overwrite=true" in line and (out / "similarity.csv").read_text() == table
    replaced = cli(f"file={a}", "metric=rsa", f"out_dir={out}", "overwrite=true", "plot=false",
                   cwd=tmp_path, module="probe.compare")
    assert replaced.returncode == 0, replaced.stderr
    assert ",rsa," in (out / "similarity.csv").read_text()


@pytest.mark.parametrize("module, extra", [("probe.fit", ()), ("probe.encode", ("targets",))])
def test_fit_and_encode_refuse_a_folder_of_earlier_findings(tmp_path, module, extra):
    path = write_probe_file(tmp_path / "a.h5", np.arange(40),
                            {"x/output": np.random.default_rng(1).normal(size=(40, 6))})
    with h5py.File(path, "a") as f:
        f["target"] = np.arange(40) % 2
    args = [f"file={path}", "plot=false"]
    if extra:
        np.save(tmp_path / "t.npy", np.random.default_rng(2).normal(size=(40, 3)))
        args.append(f"targets={tmp_path / 't.npy'}")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    line = error_line(cli(*args, f"out_dir={tmp_path / 'mine'}", cwd=tmp_path, module=module))
    assert "holds earlier findings (notes.txt)" in line
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_gradcam_refuses_to_replace_its_earlier_maps(make_cfg, tmp_path):
    from probe.analyses.gradcam import write_gradcam

    path = probe.run(make_cfg(*TINY_NET, "layers=[features.3]", "hooks=[forward,backward]"))
    written = write_gradcam(path)
    before = written.read_bytes()
    with pytest.raises(OutputError, match="holds earlier Grad-CAM maps; .* overwrite=true"):
        write_gradcam(path)
    assert written.read_bytes() == before
    assert write_gradcam(path, overwrite=True) == written


# -- files of two datasets are never paired unasked ---------------------------------------------

def test_files_of_two_datasets_are_refused_then_paired_when_asked(tmp_path, caplog):
    from probe.analyses.compare import compare, write_similarity

    a, b = _pair(tmp_path, ({"length": 40, "files": "1"}, {"length": 40, "files": "2"}))
    with pytest.raises(DataError, match=r"file=.*a.h5' was made from SetA\(path=a\) and "
                                        r"other=.*b.h5' from SetB\(path=b\), whose data "
                                        r"fingerprints differ \(files\): .*pair_anyway=true"):
        compare(a, b)
    with caplog.at_level(logging.WARNING):
        result = compare(a, b, pair_anyway=True)
    assert "paired by /index anyway" in caplog.text
    write_similarity(result, tmp_path / "out")
    said = json.loads((tmp_path / "out" / "compared.json").read_text())
    assert "whose data fingerprints differ (files)" in said["notes"]["paired_anyway"]


# -- the plan foresees what a run writes, and a small run writes a small file ------------------

def _data_bytes(path) -> int:
    """What the file's datasets hold (strings counted as the plan guesses them: 64 bytes)."""
    total = 0

    def add(name, obj):
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.size * (64 if obj.dtype.kind == "O" else obj.dtype.itemsize)

    with h5py.File(path) as f:
        f.visititems(add)
    return total


def _text(tiny_lm, tmp_path, *extra):
    from tests.tiny_text import documents, write_jsonl

    corpus = write_jsonl(tmp_path / "d.jsonl", documents(9, seed=1, low=2, high=12))
    return ("model=transformers", f"model.name={tiny_lm}", "dataset=text",
            f"dataset.path={corpus}", "layers=[transformer.h.0]", *extra)


@pytest.mark.parametrize("case", ["images", "text", "generation"])
def test_the_plans_estimate_is_what_the_run_writes(make_cfg, tiny_lm, tmp_path, case):
    overrides = {"images": (*TINY_NET, "layers=[fc,features.3]"),
                 "text": _text(tiny_lm, tmp_path),
                 "generation": _text(tiny_lm, tmp_path, "generate.max_new_tokens=4",
                                     "generate.stop_at_eos=false")}[case]
    plan = probe.plan(make_cfg(*overrides))
    path = probe.execute(plan)
    assert plan.estimated_bytes == _data_bytes(path)


def test_a_small_generation_writes_a_small_file(make_cfg, tiny_lm, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        path = probe.run(make_cfg(*_text(tiny_lm, tmp_path, "generate.max_new_tokens=7")))
    assert path.stat().st_size < 1 << 20  # 0.2.0: 8.4 MB, a 2 MiB chunk per dataset
    assert "9 samples, at most" in caplog.text


def test_a_vision_language_runs_token_rows_are_in_the_estimate(tmp_path, caplog):
    from tests.test_vlm import vlm_cfg
    from tests.tiny_vlm import tiny_vlm

    folder = tiny_vlm("llava", tmp_path / "llava")
    rng = np.random.default_rng(0)
    from PIL import Image

    rows = []
    for n, prompt in enumerate(["the cat sat", "a big red dog ran under the tree", "it was"]):
        Image.fromarray((rng.random((32, 40, 3)) * 255).astype("uint8")).save(
            tmp_path / f"{n}.png")
        rows.append(json.dumps({"image": f"{n}.png", "text": prompt}))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(rows) + "\n")
    with caplog.at_level(logging.INFO):
        plan = probe.plan(vlm_cfg(folder, pairs, tmp_path / "v.h5",
                                  "layers=[model.language_model.layers.1]"))
    assert "3 samples, about" in caplog.text  # the processor's image tokens, counted
    written = _data_bytes(probe.execute(plan))
    assert 0.5 * written < plan.estimated_bytes < 2 * written


# -- a model that fails on padding fails before any file ---------------------------------------

def test_a_model_that_fails_on_padded_batches_fails_in_the_plan(make_cfg, tiny_lm, tmp_path):
    from transformers import GPT2LMHeadModel

    class PaddingBreaks(GPT2LMHeadModel):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            if attention_mask is not None and not attention_mask.all():
                raise RuntimeError("the mask's shape is not supported")
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model = PaddingBreaks.from_pretrained(tiny_lm).eval()
    with pytest.raises(ConfigError, match=r"the model fails on a padded batch of 2 samples of "
                                          r"\d+ tokens in the model: the mask's shape is not "
                                          r"supported"):
        probe.plan(make_cfg(*_text(tiny_lm, tmp_path)), model=model)
    assert no_h5_files(tmp_path)


# -- every refusal is one line that quotes the user's own value --------------------------------

@pytest.mark.parametrize("override, said", [
    ("generate.max_new_tokens=abc", "generate.max_new_tokens=abc: Value 'abc' of type 'str' "
                                    "could not be converted to Integer"),
    ("reduce=avg", "reduce=avg: Invalid value 'avg', expected one of [none, mean, max, "
                   "flatten, pca, srp]"),
    ("hooks=forward", "hooks=forward: Invalid value assigned: str is not a ListConfig, list or "
                      "tuple; write it as a list: 'hooks=[forward]'"),
    ("batchsize=4", "Could not override 'batchsize': Key 'batchsize' not in 'ProbeConfig'; to "
                    "append to your config use +batchsize=4"),
    ("model=vgg17", "Could not find 'model/vgg17'; available options in 'model': custom, "),
    ("batch_size=[1", "cannot read the override 'batch_size=[1' (no viable alternative"),
    ("hooks=[attenton]", "hook 'attenton' is unknown; use any of forward, forward_pre"),
])
def test_hydras_refusals_are_one_line_with_the_value(tmp_path, override, said):
    result = cli(*TINY_NET, "layers=[fc]", override, cwd=tmp_path)
    assert said in error_line(result)
    assert "HYDRA_FULL_ERROR" not in result.stderr and no_h5_files(tmp_path)


@pytest.mark.parametrize("overrides, value", [
    (["device=cuda:7"], "device='cuda:7'"), (["limit=-1"], "limit=-1"),
    (["shard.index=3", "shard.count=2"], "shard.index=3, shard.count=2"),
    (["hooks=[backward]", "objective=top5"], "objective='top5'"),
    (["layers=[nope]"], "layer 'nope'"), (["reduce_by_layer={nope:mean}"], "'nope'"),
    (["dataset.num_samples=-2"], "dataset.num_samples=-2"), (["batch_size=0"], "batch_size=0"),
    (["batch_tokens=3"], "batch_tokens=3"), (["num_workers=-1"], "num_workers=-1"),
    (["output.file_locking=sometimes"], "output.file_locking='sometimes'"),
    (["output.compression=gzip", "output.compression_level=42"],
     "output.compression_level=42"),
])
def test_every_refusal_quotes_the_value_it_refuses(tmp_path, overrides, value):
    line = error_line(cli(*TINY_NET, "layers=[fc]", *overrides, cwd=tmp_path))
    assert value in line, line
    assert no_h5_files(tmp_path)


def test_the_compare_command_says_a_missing_list_bracket_in_one_line(tmp_path):
    line = error_line(cli("file=a.h5", "keys=transformer.h.1", cwd=tmp_path,
                          module="probe.compare"))
    assert "keys=transformer.h.1: " in line and "'keys=[transformer.h.1]'" in line


def test_a_model_without_its_head_says_the_names_lose_their_prefix(make_cfg, tiny_lm, tmp_path):
    with pytest.raises(ConfigError, match=r"layer 'transformer.h.1' matches no module .* names "
                                          r"it without 'transformer.': 'h.1' .*model.head=base"):
        probe.plan(make_cfg(*_text(tiny_lm, tmp_path), "model.head=base",
                            "layers=[transformer.h.1]"))


def test_generation_refused_quotes_the_users_count(make_cfg, tiny_lm, tmp_path):
    with pytest.raises(ConfigError, match=r"^generate.max_new_tokens=7: GPT2Model has no "
                                          "language-model head"):
        probe.plan(make_cfg(*_text(tiny_lm, tmp_path), "model.head=base", "layers=[h.1]",
                            "generate.max_new_tokens=7"))


def test_a_pooled_attention_pattern_is_not_said_to_have_no_effect(make_cfg, tiny_lm, tmp_path,
                                                                   caplog):
    with caplog.at_level(logging.WARNING):
        path = probe.run(make_cfg(*_text(tiny_lm, tmp_path, "dataset.max_length=24"),
                                  "layers=[transformer.h.0.attn]", "hooks=[attention]",
                                  "tokens=last"))
    assert "has no effect" not in caplog.text
    with h5py.File(path) as f:
        assert f["transformer.h.0.attn/attention"].shape == (9, 2, 24)  # a query row a sample


def test_opening_a_missing_file_is_a_probe_error(tmp_path):
    with pytest.raises(ProbeError, match=r"nothing.h5' does not exist; pass the .h5 file"):
        probe.open(tmp_path / "nothing.h5")
