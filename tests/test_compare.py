"""CKA and RSA over stored files equal in-memory references, pair rows by /index, and refuse
wrong inputs in one line."""

from __future__ import annotations

import csv
import dataclasses
import inspect
import itertools
import logging

import h5py
import numpy as np
import pytest
import scipy.stats
import torch
import yaml

import probe
from probe.analyses.compare import compare, write_similarity
from probe.errors import ConfigError, DataError
from tests.conftest import REPO, TINY_NET, cli, compose_cfg, compose_command

LAYERS = ["features.1", "features.3", "pool", "fc"]
KEYS = [f"{layer}/output" for layer in LAYERS]
SAMPLES = 48


# small matrices gain nothing from threads (tests/conftest.py one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _run(path, *overrides):
    cfg = compose_cfg(*TINY_NET, f"layers=[{','.join(LAYERS)}]", f"dataset.num_samples={SAMPLES}",
                      "dataset.image_size=16", "batch_size=16", *overrides, output=path,
                      tiny=False)
    return probe.run(cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """TinyNet (8 wide) and a wider TinyNet (12) on the same 48 synthetic images, and the
    second model's runs of other samples: a random 30, and the odd shard."""
    folder = tmp_path_factory.mktemp("compare")
    return {
        "a": _run(folder / "a.h5"),
        "b": _run(folder / "b.h5", "+model.width=12"),
        "subset": _run(folder / "subset.h5", "+model.width=12", "limit=30", "subset=random"),
        "shard": _run(folder / "shard.h5", "+model.width=12", "shard.count=2", "shard.index=1"),
    }


def _rows(path, key):
    with h5py.File(path, "r") as f:
        return f[key][:].reshape(len(f[key]), -1).astype(np.float64), f["index"][:]


# --- independent references, on whole matrices in memory ------------------------------------

def cka_reference(x, y):
    """Kornblith et al. (2019), eq. 3-4: HSIC(K, L) = tr(KHLH), normalised, on the n x n
    linear kernels (cheaper than Dx x Dy for these wide, short matrices)."""
    n = len(x)
    h = np.eye(n) - 1 / n
    k, m = h @ x @ x.T @ h, h @ y @ y.T @ h
    return np.sum(k * m) / (np.linalg.norm(k) * np.linalg.norm(m))


def test_the_two_forms_of_the_cka_reference_agree():
    # ||Ycᵀ Xc||_F² / (||Xcᵀ Xc||_F ||Ycᵀ Yc||_F), the feature-space form of the same value
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(30, 8))
    y[:, :5] += x
    xc, yc = x - x.mean(0), y - y.mean(0)
    features = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc)
                                                 * np.linalg.norm(yc.T @ yc))
    assert cka_reference(x, y) == pytest.approx(features, rel=1e-12)


def hsic_unbiased_reference(k, m):
    """Song et al. (2012), eq. 5, on explicit n x n kernels K and L (here m)."""
    n = len(k)
    k, m = k.copy(), m.copy()
    np.fill_diagonal(k, 0)
    np.fill_diagonal(m, 0)
    one = np.ones(n)
    return (np.trace(k @ m) + (one @ k @ one) * (one @ m @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * (one @ k @ m @ one)) / (n * (n - 3))


def cka_debiased_reference(x, y):
    k, m = x @ x.T, y @ y.T
    return hsic_unbiased_reference(k, m) / np.sqrt(
        hsic_unbiased_reference(k, k) * hsic_unbiased_reference(m, m))


def rsa_reference(x, y):
    """rsatoolbox's conventions: 1 - Pearson r RDMs, Spearman r of the upper triangles."""
    above = np.triu_indices(len(x), 1)
    return scipy.stats.spearmanr((1 - np.corrcoef(x))[above],
                                 (1 - np.corrcoef(y))[above]).statistic


REFERENCES = {"cka": cka_reference, "cka_debiased": cka_debiased_reference, "rsa": rsa_reference}


def _expected(metric, xs, ys):
    return np.array([[REFERENCES[metric](x, y) for y in ys] for x in xs])


# --- the values ------------------------------------------------------------------------------

@pytest.mark.parametrize("metric", ["cka", "cka_debiased", "rsa"])
def test_between_layers_equals_the_in_memory_reference(runs, metric):
    xs = [_rows(runs["a"], key)[0] for key in KEYS]
    expected = _expected(metric, xs, xs)
    result = compare(runs["a"], metric=metric)
    assert result.keys_a == result.keys_b == KEYS  # the model's order
    np.testing.assert_allclose(result.matrix(), expected, rtol=1e-9, atol=1e-12)
    assert 0.3 < expected[0, 3] < 0.99  # far from trivial: conv1 against the head


@pytest.mark.parametrize("accumulate, memory_mb", [("features", 256), ("gram", 64),
                                                   ("auto", 0.3), ("gram", 0.3)])
@pytest.mark.parametrize("metric", ["cka", "cka_debiased"])
def test_cka_is_the_same_from_either_accumulation_and_from_many_blocks(runs, metric,
                                                                       accumulate, memory_mb):
    # 0.3 MiB: blocks of a few rows, panels that stream the file many times
    xs = [_rows(runs["a"], key)[0] for key in KEYS]
    result = compare(runs["a"], metric=metric, accumulate=accumulate, memory_mb=memory_mb)
    np.testing.assert_allclose(result.matrix(), _expected(metric, xs, xs), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("metric", ["cka", "cka_debiased", "rsa"])
def test_between_two_models_files(runs, metric):
    xs = [_rows(runs["a"], key)[0] for key in KEYS]
    ys = [_rows(runs["b"], key)[0] for key in KEYS]
    result = compare(runs["a"], runs["b"], metric=metric, memory_mb=2)  # several panels
    assert result.samples == SAMPLES
    expected = _expected(metric, xs, ys)
    np.testing.assert_allclose(result.matrix(), expected, rtol=1e-9, atol=1e-12)
    assert not np.allclose(np.diag(expected), 1.0)  # another model: not the same features


@pytest.mark.parametrize("metric", ["cka", "cka_debiased", "rsa"])
def test_a_file_with_itself_is_1_on_the_diagonal_and_symmetric(runs, metric):
    result = compare(runs["a"], runs["a"], metric=metric)
    matrix = result.matrix()
    np.testing.assert_allclose(np.diag(matrix), 1.0, atol=1e-12)
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-12)
    assert (matrix[~np.eye(len(KEYS), dtype=bool)] < 0.999).all()


def test_debiased_hsic_is_the_u_statistic():
    # the reference formula itself against the definition: the mean over every ordered
    # 4-tuple of distinct samples of k_ij l_ij + k_ij l_qr - 2 k_ij l_iq (Song et al. 2012)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    k, m = x @ x.T, y @ y.T
    terms = [k[i, j] * m[i, j] + k[i, j] * m[q, r] - 2 * k[i, j] * m[i, q]
             for i, j, q, r in itertools.permutations(range(7), 4)]
    assert hsic_unbiased_reference(k, m) == pytest.approx(np.mean(terms), rel=1e-10)


@pytest.fixture(scope="module")
def transformed(tmp_path_factory):
    """x, a rotated and scaled copy of it, one scaled unevenly, and a nonlinear function y of
    x; each 60 samples, narrow (12 features: sums of features) and wide (90: Gram blocks)."""
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("invariance") / "transformed.h5"
    x = rng.normal(size=(60, 12)) @ rng.normal(size=(12, 12))
    rotation, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    wide = np.concatenate([x, rng.normal(size=(60, 78))], 1)
    wide_rotation, _ = np.linalg.qr(rng.normal(size=(90, 90)))
    data = {"x": x, "rotated": 3.7 * x @ rotation + 5.0,
            "uneven": x * np.linspace(0.1, 3.0, 12), "y": np.tanh(x @ rng.normal(size=(12, 6))),
            "wide": wide, "wide_rotated": 0.2 * wide @ wide_rotation - 1.0}
    return write_probe_file(path, np.arange(60), {f"{k}/output": v for k, v in data.items()})


@pytest.mark.parametrize("metric", ["cka", "cka_debiased"])
def test_cka_is_invariant_to_rotation_and_isotropic_scaling(transformed, metric):
    result = compare(transformed, metric=metric)
    v = {(a.split("/")[0], b.split("/")[0]): value for (a, b), value in result.values.items()}
    # equal up to the float32 rounding of the stored copies
    assert v[("x", "rotated")] == pytest.approx(1.0, abs=1e-6)
    assert v[("wide", "wide_rotated")] == pytest.approx(1.0, abs=1e-6)
    assert v[("rotated", "y")] == pytest.approx(v[("x", "y")], rel=1e-6)
    assert v[("wide_rotated", "y")] == pytest.approx(v[("wide", "y")], rel=1e-6)
    # a scaling that differs by feature is not an isotropic one: CKA sees it
    assert abs(v[("uneven", "y")] - v[("x", "y")]) > 1e-3
    assert v[("x", "uneven")] < 0.999


# --- pairing rows ----------------------------------------------------------------------------

@pytest.mark.parametrize("other", ["subset", "shard", "reordered"])
@pytest.mark.parametrize("metric", ["cka", "rsa"])
def test_rows_of_two_files_are_matched_by_index(runs, tmp_path, caplog, metric, other):
    if other == "reordered":  # the first file's rows backwards, a few left out
        with h5py.File(runs["b"], "r") as f:
            keep = np.arange(SAMPLES)[::-1][5:]
            path = write_probe_file(tmp_path / "reordered.h5", f["index"][:][keep],
                                    {key: f[key][:][keep] for key in KEYS}, layers=LAYERS)
    else:
        path = runs[other]
    with caplog.at_level(logging.INFO, logger="probe.analyses.compare"):
        result = compare(runs["a"], path, metric=metric)
    ys, index_b = zip(*(_rows(path, key) for key in KEYS), strict=True)
    x_all, index_a = _rows(runs["a"], KEYS[0])
    assert not np.array_equal(index_b[0], index_a)
    rows_a = np.searchsorted(index_a, index_b[0])  # a's rows of b's samples, in b's order
    xs = [_rows(runs["a"], key)[0][rows_a] for key in KEYS]
    assert result.samples == len(index_b[0]) < SAMPLES
    assert f"matched {len(index_b[0])} samples by /index" in caplog.text
    np.testing.assert_allclose(result.matrix(), _expected(metric, xs, ys), rtol=1e-9,
                               atol=1e-12)


def test_rdm_subset_is_seeded_and_rdms_are_saved(runs, tmp_path):
    rdms = tmp_path / "rdms.h5"
    result = compare(runs["a"], runs["b"], keys=["pool"], metric="rsa", rdm_samples=20,
                     seed=4, rdms=rdms)
    again = compare(runs["a"], runs["b"], keys=["pool"], metric="rsa", rdm_samples=20, seed=4)
    other_seed = compare(runs["a"], runs["b"], keys=["pool"], metric="rsa", rdm_samples=20,
                         seed=5)
    assert result.rows == 20 and result.values == again.values != other_seed.values
    x, index = _rows(runs["a"], "pool/output")
    y, _ = _rows(runs["b"], "pool/output")
    with h5py.File(rdms, "r") as f:
        chosen = np.searchsorted(index, f["index"][:])
        assert len(chosen) == 20 and f["file/pool/output"].shape == (20, 20)
        np.testing.assert_allclose(f["file/pool/output"][:], 1 - np.corrcoef(x[chosen]),
                                   atol=1e-6)
        np.testing.assert_allclose(f["other/pool/output"][:], 1 - np.corrcoef(y[chosen]),
                                   atol=1e-6)
    assert result.values[("pool/output", "pool/output")] == pytest.approx(
        rsa_reference(x[chosen], y[chosen]), rel=1e-9)


def _token_file(path, index, lengths, ids, seed):
    rng = np.random.default_rng(seed)
    total = int(np.sum(lengths))
    return write_probe_file(path, np.asarray(index), {
        "h.0/output": rng.normal(size=(total, 6)),
        "h.1/output": np.tanh(rng.normal(size=(total, 6)) + np.asarray(ids)[:, None] / 25),
        "last/output": rng.normal(size=(len(index), 5))}, token_lengths=lengths, input_ids=ids)


LENGTHS = [3, 5, 2, 4, 6, 3, 4]


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    """Rows per token of 7 documents (27 tokens), made up: two files of the same tokens, one
    of the last 5 documents only, one whose last document is a token longer, and one whose
    document 3 holds another token."""
    folder = tmp_path_factory.mktemp("tokens")
    ids = np.random.default_rng(0).integers(0, 50, size=sum(LENGTHS))
    changed = ids.copy()
    changed[11] += 1  # document 3's second token (documents 0-2 hold 10)
    return {"a": _token_file(folder / "a.h5", range(7), LENGTHS, ids, seed=1),
            "b": _token_file(folder / "b.h5", range(7), LENGTHS, ids, seed=2),
            "tail": _token_file(folder / "tail.h5", range(2, 7), LENGTHS[2:], ids[8:], seed=3),
            "longer": _token_file(folder / "longer.h5", range(7), [*LENGTHS[:6], 5],
                                  np.append(ids, 7), seed=4),
            "retokenized": _token_file(folder / "retokenized.h5", range(7), LENGTHS, changed,
                                       seed=5)}


def test_rows_per_token_pair_up_when_both_files_hold_the_same_tokens(token_files):
    tokens = ["h.0/output", "h.1/output"]
    result = compare(token_files["a"], token_files["b"], keys=tokens)
    with h5py.File(token_files["a"], "r") as fa, h5py.File(token_files["b"], "r") as fb:
        xs = [fa[k][:].astype(np.float64) for k in tokens]
        ys = [fb[k][:].astype(np.float64) for k in tokens]
    assert result.rows == len(xs[0]) == 27 and result.samples == 7
    np.testing.assert_allclose(result.matrix(), _expected("cka", xs, ys), rtol=1e-9)
    # one row per document (as tokens=last stores it): an ordinary comparison
    assert compare(token_files["a"], token_files["b"], keys=["last"]).rows == 7


def test_token_rows_of_the_documents_both_files_hold(token_files):
    # the tail file lacks documents 0 and 1, whose 8 tokens come first in the other file
    result = compare(token_files["a"], token_files["tail"], keys=["h.1/output"], metric="rsa")
    with h5py.File(token_files["a"], "r") as fa, h5py.File(token_files["tail"], "r") as ft:
        x, y = fa["h.1/output"][8:].astype(float), ft["h.1/output"][:].astype(float)
    assert result.rows == 19 and result.samples == 5
    assert result.values[("h.1/output", "h.1/output")] == pytest.approx(rsa_reference(x, y),
                                                                        rel=1e-9)


def test_token_files_of_other_tokens_are_refused(token_files):
    with pytest.raises(DataError, match=r"other tokens for dataset sample 6 \(4 and 5 rows\).*"
                                        r"tokens=last or tokens=mean"):
        compare(token_files["a"], token_files["longer"], keys=["h.0/output"])
    with pytest.raises(DataError, match=r"other tokens for dataset sample 3 \(4 and 4 rows\)"):
        compare(token_files["a"], token_files["retokenized"], keys=["h.0/output"])
    with pytest.raises(ConfigError, match="one row per token.*one row per sample"):
        compare(token_files["a"], keys=["h.0/output", "last/output"])


# --- the command -----------------------------------------------------------------------------

def test_cli_writes_the_table_the_csv_and_the_heatmap(runs, tmp_path):
    result = cli(f"file={runs['a']}", f"other={runs['b']}", "keys=[pool,fc]",
                     f"out_dir={tmp_path}/out", cwd=tmp_path, module="probe.compare")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["cka", "pool/output", "fc/output"]
    with (tmp_path / "out" / "similarity.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert [(r["key_a"], r["key_b"], r["metric"]) for r in rows] == [
        (a, b, "cka") for a in ("pool/output", "fc/output") for b in ("pool/output", "fc/output")]
    x, _ = _rows(runs["a"], "fc/output")
    y, _ = _rows(runs["b"], "pool/output")
    assert float(rows[2]["value"]) == pytest.approx(cka_reference(x, y), rel=1e-9)
    assert (tmp_path / "out" / "similarity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "matched 48 samples" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no Hydra folders, no logs


def test_default_out_dir_is_beside_the_file(runs, tmp_path):
    from probe.analyses.compare import default_out_dir

    assert default_out_dir(runs["a"]) == runs["a"].parent / "a_compare"
    written = write_similarity(compare(runs["a"], keys=["fc"]), tmp_path / "x")
    assert written.read_text().splitlines() == [
        "key_a,key_b,metric,value", "fc/output,fc/output,cka,1.0"]


def _command_error(capsys, *overrides):
    # the command layer in this process: the line it prints and its exit status
    from probe.analyses.compare.config import CompareConfig
    from probe.commands.compare import _compare

    cfg = compose_command("compare", *overrides, schema=CompareConfig)
    with pytest.raises(SystemExit) as stopped:
        _compare(cfg)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("probe: error:")]
    assert stopped.value.code == 1 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_every_user_error_is_one_line_and_exit_1(runs, token_files, tmp_path, capsys):
    a, b, out = runs["a"], runs["b"], f"out_dir={tmp_path}/out"
    errors = {
        "file is not set": [],
        "'layer9/output' is not in": [f"file={a}", "keys=[layer9]"],
        "other_keys: 'nope/output' is not in": [f"file={a}", f"other={b}", "other_keys=[nope]"],
        "metric='cca': use cka, cka_debiased or rsa": [f"file={a}", "metric=cca"],
        "save_rdms=true saves the RDMs of metric=rsa": [f"file={a}", "save_rdms=true"],
        "does not exist": [f"file={tmp_path}/none.h5"],
        "rdm_samples=2 must be at least 3": [f"file={a}", "metric=rsa", "rdm_samples=2"],
        "memory_mb=0.0 must be a positive number": [f"file={a}", "memory_mb=0"],
        "accumulate='sums': use auto, features or gram": [f"file={a}", "accumulate=sums"],
        "accumulate=features needs a 2048 x 2048 matrix for features.1/output": [
            f"file={a}", "accumulate=features", "memory_mb=4"],
        "an RDM of 48 samples needs about": [f"file={a}", "metric=rsa", "memory_mb=0.01"],
        "one row per token (tokens=all) and": [f"file={token_files['a']}",
                                              "keys=[h.0,last]"],
        "hold other tokens for dataset sample 6": [f"file={token_files['a']}",
                                                    f"other={token_files['longer']}",
                                                    "keys=[h.0]"],
        "device='tpu' is not a device": [f"file={a}", "device=tpu"],
    }
    for message, overrides in errors.items():
        line = _command_error(capsys, *overrides, out)
        assert message in line, (message, line)
    assert not (tmp_path / "out").exists()


def test_files_that_share_no_sample_are_refused(runs, tmp_path, capsys):
    with h5py.File(runs["a"], "r") as f:
        other = write_probe_file(tmp_path / "later.h5", f["index"][:] + 1000,
                                 {"fc/output": f["fc/output"][:]})
    line = _command_error(capsys, f"file={runs['a']}", f"other={other}", "keys=[fc]",
                          f"out_dir={tmp_path}/out")
    assert "share no sample" in line and "48 samples from 0 to 47" in line
    assert "48 samples from 1000 to 1047" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["later.h5"]


def test_missing_cuda_is_an_error_and_mps_is_refused(runs, monkeypatch):
    if not torch.cuda.is_available():  # asked for, never a silent fallback to the CPU
        with pytest.raises(probe.ProbeError, match="no CUDA device is available"):
            compare(runs["a"], device="cuda")
    monkeypatch.setattr("probe.analyses.stats.resolve_device", lambda spec: torch.device("mps"))
    with pytest.raises(ConfigError, match="device=mps has no float64"):
        compare(runs["a"], device="mps")


@pytest.mark.gpu
@pytest.mark.parametrize("metric", ["cka", "cka_debiased", "rsa"])
def test_cuda_gives_the_cpu_numbers(runs, metric):
    on_cpu = compare(runs["a"], runs["b"], metric=metric)
    on_gpu = compare(runs["a"], runs["b"], metric=metric, device="cuda")
    np.testing.assert_allclose(on_gpu.matrix(), on_cpu.matrix(), rtol=1e-9, atol=1e-12)


# --- the house's rules, for this command -----------------------------------------------------

def test_defaults_live_in_the_schema_only():
    from probe.analyses.compare.config import CompareConfig
    from probe.analyses.encode.config import EncodeConfig

    for name, schema in (("compare", CompareConfig), ("encode", EncodeConfig)):
        fields = {f.name for f in dataclasses.fields(schema)}
        conf = yaml.safe_load((REPO / "conf" / f"{name}.yaml").read_text())
        assert not fields & set(conf), name


@pytest.mark.parametrize("function", ["probe.analyses.compare:compare",
                                      "probe.analyses.encode:encode",
                                      "probe.analyses.encode:write_results"])
def test_python_defaults_are_the_commands_defaults(function):
    import importlib

    from probe.analyses.compare.config import CompareConfig
    from probe.analyses.encode.config import EncodeConfig

    module, name = function.split(":")
    schema = CompareConfig if module == "probe.analyses.compare" else EncodeConfig
    defaults = {f.name: f.default for f in dataclasses.fields(schema)
                if f.default is not dataclasses.MISSING}
    signature = inspect.signature(getattr(importlib.import_module(module), name))
    shared = [p for p in signature.parameters.values() if p.name in defaults
              and p.default is not inspect.Parameter.empty]
    assert shared and all(p.default == defaults[p.name] for p in shared), shared


# --- writing files in the probe layout -------------------------------------------------------

def write_probe_file(path, index, datasets, *, layers=None, token_lengths=None,
                     input_ids=None):
    """A finished probe file holding ``datasets`` ({"<layer>/<kind>": (rows, ...)}) for the
    dataset samples ``index``; rows per token where ``token_lengths`` gives each sample's.

    Written with plain h5py in the layout DESIGN.md promises (chunked along the rows in about
    2 MiB, as a run writes it), so that it depends on no more than a reader may."""
    index = np.asarray(index, dtype=np.int64)
    layers = layers or list(dict.fromkeys(key.rpartition("/")[0] for key in datasets))
    with h5py.File(path, "w") as f:
        f.attrs.update({"config": "{}", "complete": True, "num_samples": len(index),
                        "num_committed": len(index)})
        f.attrs["layers"] = np.array(layers, dtype=h5py.string_dtype())
        f.create_dataset("index", data=index)
        if token_lengths is not None:
            f.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(token_lengths)]))
        if input_ids is not None:
            f.create_dataset("input_ids", data=np.asarray(input_ids, dtype=np.int32))
        for key, values in datasets.items():
            values = np.asarray(values, dtype=np.float32)
            rows = max(1, min(len(values), (2 << 20) // values[0].nbytes))  # 2 MiB, as a run
            dataset = f.create_dataset(key, data=values, chunks=(rows, *values.shape[1:]))
            layer, _, kind = key.rpartition("/")
            dataset.attrs.update({"layer": layer, "kind": kind})
            if token_lengths is not None and len(values) != len(index):
                dataset.attrs["rows"] = "token"
    return path
