"""Compact storage at capture: float8 rows (bytes and scales exactly the rule, computed here with
torch from a float32 run's rows), pca (the projection of scikit-learn's PCA fitted on the same
rows, up to each axis's sign) and srp (the stored matrix applied to the float32 rows); every
reader decodes them; the fidelity attrs are what this file computes; a killed run resumes to the
uninterrupted file, transform included; shards merge; every mistake is one line."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.analyses.compare import compare
from probe.analyses.encode import encode
from probe.errors import ConfigError, OutputError
from probe.file.exports import export
from probe.file.format import Attr
from probe.file.merge import merge
from tests.conftest import assert_same_datasets, interrupt_after, no_h5_files, run_with
from tests.tiny_text import documents, write_jsonl

transformers = pytest.importorskip("transformers")

DOCS = documents(8, seed=5, low=3, high=14)
TOKENS = "transformer.h.1/output"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("compact") / "docs.jsonl", DOCS)


def _text(make_cfg, tiny_lm, corpus, *extra, output):
    return make_cfg("model=transformers", f"model.name={tiny_lm}", "dataset=text",
                    f"dataset.path={corpus}", "layers=[transformer.h.0,transformer.h.1]",
                    "batch_size=3", *extra, output=output)


def _images(make_cfg, *extra, output):
    return make_cfg("model=custom", "model._target_=tests.tiny.TinyNet", "dataset.image_size=8",
                    "dataset.num_samples=12", "batch_size=4", "layers=[features.3,fc]", *extra,
                    output=output)


def _float8_rule(rows: torch.Tensor, scaled_axes: int):
    """The issue's rule, written out: scale = max|row| / 448 (1.0 for zeros), byte = (row /
    scale) as e4m3, over the row's last ``scaled_axes`` axes."""
    axes = tuple(range(rows.dim() - scaled_axes, rows.dim()))
    largest = rows.abs().amax(axes, keepdim=True)
    scale = torch.where(largest == 0, torch.tensor(1.0), largest / 448)
    data = (rows / scale).to(torch.float8_e4m3fn).view(torch.uint8)
    return data.numpy(), scale.reshape(scale.shape[:rows.dim() - scaled_axes]).numpy()


# -- float8 ------------------------------------------------------------------------------------

def test_float8_bytes_and_scales_are_the_rule_for_token_and_sample_rows(make_cfg, tiny_lm,
                                                                         corpus, tmp_path):
    plain = probe.run(_text(make_cfg, tiny_lm, corpus, output=tmp_path / "f32.h5"))
    packed = probe.run(_text(make_cfg, tiny_lm, corpus, "output.dtype=float8",
                             output=tmp_path / "f8.h5"))
    with h5py.File(plain) as a, h5py.File(packed) as b:
        rows = torch.from_numpy(a[TOKENS][:])
        data, scale = _float8_rule(rows, 1)  # a scale per token
        assert b[TOKENS].dtype == np.uint8 and b[TOKENS].shape == rows.shape
        np.testing.assert_array_equal(b[TOKENS][:], data)
        np.testing.assert_array_equal(b[TOKENS + "_scale"][:], scale)
        assert b[TOKENS + "_scale"].attrs["rows"] == "token"
        np.testing.assert_array_equal(b["offsets"][:], a["offsets"][:])
        # a reader without probe: one lookup in the attrs' table, one multiply
        table = b[TOKENS].attrs["decode_table"]
        by_hand = table[b[TOKENS][:]] * b[TOKENS + "_scale"][:][:, None]
    with probe.open(packed) as f:
        decoded = f[TOKENS][:]
        assert decoded.dtype == np.float32
        np.testing.assert_array_equal(decoded, by_hand)
        assert f.features == ["transformer.h.0/output", TOKENS]  # the scales are not rows
    # within e4m3's rounding: 3 mantissa bits, half a step of 2^-3 relative (subnormals: the
    # scale's absolute step)
    error = np.abs(decoded - rows.numpy())
    bound = np.maximum(np.abs(rows.numpy()) * 2.0 ** -4, scale[:, None] * 2.0 ** -10)
    assert (error <= bound).all()


def test_float8_of_images_has_a_scale_per_sample(make_cfg, tmp_path):
    from tests.tiny import TinyNet

    torch.manual_seed(0)
    net = TinyNet().eval()
    plain = run_with(_images(make_cfg, output=tmp_path / "f32.h5"), model=net)
    packed = run_with(_images(make_cfg, "output.dtype=float8", output=tmp_path / "f8.h5"),
                      model=net)
    with h5py.File(plain) as a, h5py.File(packed) as b:
        for key in ("features.3/output", "fc/output"):
            rows = torch.from_numpy(a[key][:])
            data, scale = _float8_rule(rows, rows.dim() - 1)
            np.testing.assert_array_equal(b[key][:], data)
            np.testing.assert_array_equal(b[key + "_scale"][:], scale)
            assert b[key + "_scale"].shape == (12,)


def test_attention_patterns_have_a_scale_per_query_row(make_cfg, tiny_lm, corpus, tmp_path):
    key = "transformer.h.0.attn/attention"
    common = ("layers=[transformer.h.0.attn]", "hooks=[attention]", "tokens=last")
    plain = probe.run(_text(make_cfg, tiny_lm, corpus, *common, output=tmp_path / "f32.h5"))
    packed = probe.run(_text(make_cfg, tiny_lm, corpus, *common, "output.dtype=float8",
                             output=tmp_path / "f8.h5"))
    with h5py.File(plain) as a, h5py.File(packed) as b:
        rows = torch.from_numpy(a[key][:])
        data, scale = _float8_rule(rows, 1)
        assert b[key + "_scale"].shape == rows.shape[:-1]
        np.testing.assert_array_equal(b[key][:], data)
        np.testing.assert_array_equal(b[key + "_scale"][:], scale)


def test_a_nan_in_a_float8_row_is_one_line_and_writes_nothing(make_cfg, tmp_path):
    from tests.tiny import TinyNet

    net = TinyNet().eval()
    net.fc.bias.data[0] = float("nan")
    with pytest.raises(ConfigError) as caught:
        run_with(_images(make_cfg, "output.dtype=float8", output=tmp_path / "nan.h5"),
                 model=net)
    said = str(caught.value)
    assert "\n" not in said and "fc/output" in said and "NaN" in said
    assert "output.dtype=float32" in said
    assert no_h5_files(tmp_path)


# -- projections -------------------------------------------------------------------------------

@pytest.mark.parametrize("gram_limit", [8192, 8], ids=["gram", "svd"])
def test_pca_rows_are_scikit_learns_projection_up_to_sign(gram_limit, make_cfg, tiny_lm, corpus,
                                                          tmp_path, monkeypatch):
    # rows wider than the Gram matrix's limit are held and decomposed by an SVD: both ways
    decomposition = pytest.importorskip("sklearn.decomposition")
    monkeypatch.setattr("probe.pipeline.compact.fit.GRAM_LIMIT", gram_limit)
    plain = probe.run(_text(make_cfg, tiny_lm, corpus, output=tmp_path / "f32.h5"))
    projected = probe.run(_text(make_cfg, tiny_lm, corpus, "reduce=pca", "reduce_components=5",
                                "reduce_fit_samples=4", output=tmp_path / "pca.h5"))
    with h5py.File(plain) as a:
        rows, offsets = a[TOKENS][:], a["offsets"][:]
    reference = decomposition.PCA(5).fit(rows[:offsets[4]].astype(np.float64))  # 4 samples
    expected = reference.transform(rows.astype(np.float64))
    with probe.open(projected) as f:
        stored = f[TOKENS][:]
        transform = f.transform(TOKENS)
        assert stored.shape == (len(rows), 5)
        assert f[TOKENS].attrs["components"] == 5
        signs = np.sign((stored * expected).sum(0))
        np.testing.assert_allclose(stored, expected * signs, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(transform["explained_variance"],
                                   reference.explained_variance_, rtol=1e-4)
        assert transform["attrs"]["fit_samples"] == 4
        assert transform["attrs"]["fit_rows"] == offsets[4]
        # mapped back: the float32 rows as far as 5 axes keep them, which is sklearn's
        np.testing.assert_allclose(f.inverse(TOKENS, stored),
                                   reference.inverse_transform(expected), rtol=1e-3, atol=1e-3)
        ratio = float(f[TOKENS].attrs["fidelity_explained_variance"])
        assert ratio == pytest.approx(reference.explained_variance_ratio_.sum(), rel=1e-5)


def test_srp_rows_are_the_stored_matrix_applied_to_float32_rows(make_cfg, tmp_path):
    from tests.tiny import TinyNet

    torch.manual_seed(0)
    net = TinyNet().eval()
    plain = run_with(_images(make_cfg, output=tmp_path / "f32.h5"), model=net)
    projected = run_with(_images(make_cfg, "reduce=srp", "reduce_components=12",
                                 "reduce_by_layer={fc:none}", output=tmp_path / "srp.h5"),
                         model=net)
    with h5py.File(plain) as a, probe.open(projected) as f:
        rows = a["features.3/output"][:].reshape(12, -1)
        matrix = f.transform("features.3/output")["components"]
        assert matrix.shape == (12, rows.shape[1])
        density = (matrix != 0).mean()
        assert 0.5 / np.sqrt(rows.shape[1]) < density < 2 / np.sqrt(rows.shape[1])
        np.testing.assert_allclose(f["features.3/output"][:], rows @ matrix.T, rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_array_equal(f["fc/output"][:], a["fc/output"][:])  # not projected
        assert f.transform("fc/output") is None
    with h5py.File(projected) as f:  # every dataset names its axes, the transform's too
        group = f["transform/features.3/output"]
        assert list(group["components"].attrs["dims"]) == ["component", "feature"]
        assert list(group["mean"].attrs["dims"]) == ["feature"]


# -- the fidelity report -----------------------------------------------------------------------

def test_the_fidelity_attrs_are_this_tests_own_computation(make_cfg, tiny_lm, corpus, tmp_path,
                                                           caplog):
    plain = probe.run(_text(make_cfg, tiny_lm, corpus, output=tmp_path / "f32.h5"))
    caplog.set_level("INFO", logger="probe")
    # batches in dataset order: the first rows computed are the file's first
    packed = probe.run(_text(make_cfg, tiny_lm, corpus, "output.dtype=float8",
                             "output.fidelity_rows=20", "bucket_by_length=false",
                             output=tmp_path / "f8.h5"))
    with h5py.File(plain) as a, probe.open(packed) as f:
        x = a[TOKENS][:20].astype(np.float64)
        y = f[TOKENS][:20].astype(np.float64)
        attrs = dict(f[TOKENS].attrs)
    error = np.linalg.norm(x - y, axis=1) / np.linalg.norm(x, axis=1)
    cosine = (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
    xc, yc = x - x.mean(0), y - y.mean(0)
    cka = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    assert attrs["fidelity_rows"] == 20
    assert attrs["fidelity_mean_relative_error"] == pytest.approx(error.mean(), rel=1e-6)
    assert attrs["fidelity_max_relative_error"] == pytest.approx(error.max(), rel=1e-6)
    assert attrs["fidelity_min_cosine"] == pytest.approx(cosine.min(), rel=1e-9)
    assert attrs["fidelity_cka"] == pytest.approx(cka, rel=1e-9)
    assert 0 < error.max() < 0.1
    assert any(TOKENS in r.message and "relative error" in r.message for r in caplog.records)


def test_float32_rows_get_no_report_and_zero_rows_turn_it_off(make_cfg, tmp_path):
    full = probe.run(_images(make_cfg, output=tmp_path / "f32.h5"))
    off = probe.run(_images(make_cfg, "output.dtype=float16", "output.fidelity_rows=0",
                            output=tmp_path / "off.h5"))
    for path in (full, off):
        with h5py.File(path) as f:
            assert not any(name.startswith("fidelity") for name in f["fc/output"].attrs)


# -- every reader decodes ----------------------------------------------------------------------

def test_every_reader_and_export_reads_float8_as_floats(make_cfg, tiny_lm, corpus, tmp_path):
    pytest.importorskip("xarray")
    packed = probe.run(_text(make_cfg, tiny_lm, corpus, "output.dtype=float8",
                             output=tmp_path / "f8.h5"))
    with probe.open(packed) as f:
        expected = f[TOKENS][:]
        batches = [x for x, _ in f.loader(TOKENS, batch_size=7)]
        np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)
        np.testing.assert_array_equal(f.to_xarray(TOKENS).values, expected)
        np.testing.assert_array_equal(f.rows_of(TOKENS, row=2),
                                      expected[f.offsets[2]:f.offsets[3]])
    done = export(packed, "npy", out_dir=tmp_path / "npy")
    np.testing.assert_array_equal(np.load(tmp_path / "npy" / f"{TOKENS}.npy"), expected)
    assert not any("scale" in str(w.path) for w in done.files)
    scipy_io = pytest.importorskip("scipy.io")
    done = export(packed, "mat", out_dir=tmp_path / "mat")
    loaded = scipy_io.loadmat(done.files[0].path)
    assert any(np.array_equal(value, expected) for value in loaded.values()
               if getattr(value, "shape", None) == expected.shape)
    pq = pytest.importorskip("pyarrow.parquet")
    export(packed, "parquet", out_dir=tmp_path / "pq")
    table = pq.read_table(tmp_path / "pq" / "f8.parquet")
    assert TOKENS + "_scale" not in table.column_names
    np.testing.assert_array_equal(np.stack(table[TOKENS].to_numpy(zero_copy_only=False)),
                                  expected)


def test_compare_and_encode_read_float8_as_floats(make_cfg, tmp_path):
    plain = probe.run(_images(make_cfg, output=tmp_path / "f32.h5"))
    packed = probe.run(_images(make_cfg, "output.dtype=float8", output=tmp_path / "f8.h5"))
    close = compare(plain, packed, metric="cka", keys=["features.3/output"])
    assert 0.99 < close.values[("features.3/output", "features.3/output")] < 1 - 1e-9
    with h5py.File(plain) as f:
        np.save(tmp_path / "targets.npy", f["fc/output"][:])
    ours, theirs = (encode(path, tmp_path / "targets.npy", ["features.3/output"], folds=3)
                    for path in (packed, plain))
    np.testing.assert_allclose(ours[0]["r"], theirs[0]["r"], atol=0.05)


# -- resume, shards ----------------------------------------------------------------------------

def test_a_killed_pca_float8_run_resumes_to_the_uninterrupted_file(make_cfg, tiny_lm, corpus,
                                                                   tmp_path, monkeypatch):
    extra = ("reduce=pca", "reduce_components=4", "reduce_fit_samples=5", "output.dtype=float8",
             "output.commit_every=1", "bucket_by_length=false")
    whole = probe.run(_text(make_cfg, tiny_lm, corpus, *extra, output=tmp_path / "whole.h5"))
    cfg = _text(make_cfg, tiny_lm, corpus, *extra, output=tmp_path / "killed.h5")
    interrupt_after(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        probe.run(cfg)
    assert (tmp_path / "killed.h5.partial").exists()
    resumed = probe.run(cfg)
    keys = [TOKENS, TOKENS + "_scale", "offsets", f"transform/{TOKENS}/components",
            f"transform/{TOKENS}/mean", f"transform/{TOKENS}/explained_variance"]
    # the fidelity figures are of the rows each run computed: the resumed run's, its own
    figures = [Attr.FIDELITY_ROWS, *(n for n in Attr.FIDELITY
                                     if n != "fidelity_explained_variance")]
    assert_same_datasets(whole, resumed, keys, skip_attrs=figures)
    with h5py.File(resumed) as f:
        assert f[TOKENS].attrs["fidelity_rows"] > 0
        assert f[f"transform/{TOKENS}"].attrs["fit_samples"] == 5


def test_shards_of_a_pca_run_fit_the_same_axes_and_merge(make_cfg, tmp_path):
    extra = ("reduce=pca", "reduce_components=3", "reduce_fit_samples=6",
             "reduce_by_layer={fc:none}", "output.dtype=float8")
    whole = probe.run(_images(make_cfg, *extra, output=tmp_path / "whole.h5"))
    shards = [probe.run(_images(make_cfg, *extra, f"shard.index={i}", "shard.count=2",
                                output=tmp_path / f"shard{i}.h5")) for i in range(2)]
    merged = merge(tmp_path / "merged.h5", shards)
    with probe.open(whole) as a, probe.open(merged) as b:
        for key in ("features.3/output", "fc/output"):  # batches of other samples: 1 ulp
            np.testing.assert_allclose(a[key][:], b[key][:], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(a.transform("features.3/output")["components"],
                                      b.transform("features.3/output")["components"])
    other = probe.run(_images(make_cfg, *extra[:-2], "reduce_fit_samples=5",
                              "reduce_by_layer={fc:none}", "output.dtype=float8",
                              "shard.index=1", "shard.count=2", output=tmp_path / "other.h5"))
    with pytest.raises(OutputError, match="comes from another config"):
        merge(tmp_path / "refused.h5", [shards[0], other])


# -- mistakes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, said", [
    (("reduce=pca", "reduce_components=5000"), "reduce_components=5000"),
    (("reduce=pca",), "set it, e.g. reduce_components=64"),
    (("reduce=pca", "reduce_components=3", "reduce_fit_samples=0"), "reduce_fit_samples=0"),
    (("reduce=pca", "reduce_components=12", "reduce_fit_samples=2",
      "reduce_by_layer={fc:none}"), "2 fit rows from 2 samples cannot give 12 components"),
    (("output.fidelity_rows=-1",), "output.fidelity_rows=-1"),
])
def test_each_mistake_is_one_line_and_writes_nothing(extra, said, make_cfg, tmp_path):
    with pytest.raises(ConfigError) as caught:
        probe.run(_images(make_cfg, *extra, output=tmp_path / "bad.h5"))
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert no_h5_files(tmp_path)


def test_pca_on_attention_patterns_is_one_line(make_cfg, tiny_lm, corpus, tmp_path):
    with pytest.raises(ConfigError) as caught:
        probe.run(_text(make_cfg, tiny_lm, corpus, "layers=[transformer.h.0.attn]",
                        "hooks=[attention]", "reduce=pca", "reduce_components=2",
                        output=tmp_path / "bad.h5"))
    assert "reduce=pca" in str(caught.value) and "\n" not in str(caught.value)
    assert no_h5_files(tmp_path)


def test_float8_is_not_a_model_dtype(make_cfg, tiny_lm, corpus, tmp_path):
    with pytest.raises(ConfigError, match="model.dtype='float8' is unknown"):
        probe.run(_text(make_cfg, tiny_lm, corpus, "model.dtype=float8",
                        output=tmp_path / "bad.h5"))


def test_the_export_command_says_how_compact_rows_were_stored(make_cfg, tmp_path):
    from tests.cli import cli

    packed = probe.run(_images(make_cfg, "output.dtype=float8", output=tmp_path / "f8.h5"))
    with probe.open(packed) as f:
        said = f.stored_as("fc/output")
        assert said.startswith("float8 (e4m3 bytes, a float32 scale per row); against float32 "
                               "over 12 rows: relative error")
    done = cli(f"file={packed}", "to=npy", cwd=tmp_path, module="probe.export")
    assert done.returncode == 0, done.stderr
    assert f"fc/output: stored as {said}" in done.stderr

def test_pca_fits_and_stores_the_rows_of_a_generation(make_cfg, tiny_lm, corpus, tmp_path):
    # the fit pass generates as the run does: its rows are the prompt's and the answer's
    common = ("generate.max_new_tokens=3", "generate.stop_at_eos=false")
    plain = probe.run(_text(make_cfg, tiny_lm, corpus, *common, output=tmp_path / "f32.h5"))
    projected = probe.run(_text(make_cfg, tiny_lm, corpus, *common, "reduce=pca",
                                "reduce_components=4", "reduce_fit_samples=8",
                                output=tmp_path / "pca.h5"))
    with h5py.File(plain) as a, probe.open(projected) as f:
        rows = a[TOKENS][:]
        transform = f.transform(TOKENS)
        assert transform["attrs"]["fit_rows"] == len(rows)  # every sample's, answers included
        expected = (rows - transform["mean"]) @ transform["components"].T
        np.testing.assert_allclose(f[TOKENS][:], expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(f["generated"][:], a["generated"][:])


def test_a_row_too_small_for_its_scale_reads_back_without_nan():
    # max|row| / 448 underflows to 0 below about 6e-43: the scale is float32's smallest then
    from probe.file.encodings import decode_float8
    from probe.pipeline.compact.encodings import Float8

    rows = torch.tensor([[1e-43, -5e-44, 3.3e-44, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, -2.0, 0, 3]])
    parts = Float8().encode("k", rows, 1)
    data, scale = _float8_rule(rows[2:], 1)
    np.testing.assert_array_equal(parts["k"][2:].numpy(), data)  # the rule, elsewhere
    np.testing.assert_array_equal(parts["k_scale"][2:].numpy(), scale)
    back = decode_float8(parts["k"].numpy(), parts["k_scale"].numpy())
    assert not np.isnan(back).any()
    np.testing.assert_allclose(back[0], rows[0].numpy(), rtol=0.07, atol=2e-45)
    assert parts["k_scale"][1] == 1.0 and (back[1] == 0).all()


def test_float8_targets_and_rdms_from_a_probe_file_read_as_floats(make_cfg, tmp_path):
    from probe.analyses.compare.brain import _load
    from probe.analyses.encode.targets import open_targets

    packed = probe.run(_images(make_cfg, "output.dtype=float8", output=tmp_path / "f8.h5"))
    with probe.open(packed) as f:
        expected = f["fc/output"][:]
    targets = open_targets(f"{packed}:fc/output")
    np.testing.assert_array_equal(targets.rows(np.arange(12)), expected.astype(np.float64))
    targets.close()
    np.testing.assert_array_equal(_load(f"{packed}:fc/output", "rdm"), expected)


def test_the_fit_pass_adds_nothing_to_the_interventions_count(make_cfg, tiny_lm, corpus,
                                                              tmp_path, caplog):
    from omegaconf import OmegaConf

    caplog.set_level("INFO", logger="probe")
    cfg = _text(make_cfg, tiny_lm, corpus, "reduce=pca", "reduce_components=3",
                "reduce_fit_samples=8", output=tmp_path / "pca.h5")
    cfg.intervene = OmegaConf.create([{"at": "transformer.h.0", "do": "zero",
                                       "positions": "last"}])
    probe.run(cfg)
    said = [r.message for r in caplog.records if "interventions applied" in r.message]
    assert said and said[-1].endswith("zero at transformer.h.0: 8")  # a last token per sample
