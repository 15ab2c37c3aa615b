"""python -m probe.export: npy, Parquet and MATLAB files that hold the stored values exactly (as
h5py reads them), written block by block within a memory budget, into a folder that is whole
or absent, and the refusals, one line each. The saelens route: tests/test_export_saelens.py."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import probe
from probe.errors import ConfigError, DataError, OutputError
from probe.file.exports import export
from probe.file.format import DatasetSpec
from probe.file.store import Store, filter_options
from tests.conftest import TINY_NET, cli, compose_cfg, error_line

CONV, FC = "features.3/output", "fc/output"


def image_file(path: Path, rows: int = 10, *, shape=(3, 4, 5), dtype: str = "float32",
               compression: str = "none", files: bool = False, finish: bool = True,
               extra: dict | None = None, batch: int = 4) -> Path:
    """A probe file of image rows, made by the store: a conv map (``shape``) and a vector
    (``fc``) per sample, seeded values, targets; with ``files`` a /file of paths; not
    finished: a partial file."""
    rng = np.random.default_rng(0)
    specs = {CONV: DatasetSpec(shape, dtype, {"dims": ["sample", "channel", "height", "width"],
                                              "dtype": dtype}),
             FC: DatasetSpec((6,), dtype, {"dims": ["sample", "feature"], "dtype": dtype}),
             **(extra or {})}
    if files:
        specs["file"] = DatasetSpec((), "str", {"dims": ["sample"]}, compressible=False)
    store = Store(path, config_yaml="model: {}\n", num_rows=rows, datasets=specs,
                  filters=filter_options(compression), attrs={"layers": ["features.3", "fc"]})
    with store:
        for start in range(0, rows, batch):
            stop = min(rows, start + batch)
            values = {key: torch.from_numpy(rng.normal(size=(stop - start, *spec.row_shape))
                                            .astype(np.float32)).to(_torch_dtype(spec.dtype))
                      for key, spec in specs.items() if spec.dtype != "str"}
            if files:
                values["file"] = np.array([f"cat/{n}.png" for n in range(start, stop)], object)
            store.append(torch.arange(start, stop) * 3, torch.arange(start, stop) % 4, values)
            store.commit()
        if finish:
            store.finish()
    return path


def token_file(path: Path, windows: int = 9, context: int = 8, *, widths=(4, 6),
               last: int | None = 3, lengths=None, dtype: str = "float32",
               per_sample_key: bool = False, attrs: dict | None = None, batch: int = 4) -> Path:
    """A packed text file made by the store: ``windows`` windows of ``context`` token rows
    (the last ``last`` rows long, or ``lengths`` each), a key per width
    (``block.<n>/output``), /input_ids, /positions, /document; ``per_sample_key`` adds
    ``pooled/output``, a row per window."""
    rng = np.random.default_rng(1)
    lengths = list(lengths) if lengths is not None else (
        [context] * (windows - 1) + [last if last is not None else context])
    total = sum(lengths)
    token = {"dims": ["token"]}
    specs = {f"block.{n}/output": DatasetSpec((w,), dtype, {"dims": ["token", "feature"],
                                                            "dtype": dtype}, per_position=True)
             for n, w in enumerate(widths)}
    specs.update({name: DatasetSpec((), kind, token, compressible=False, per_position=True)
                  for name, kind in (("input_ids", "int32"), ("positions", "int32"),
                                     ("document", "int64"))})
    if per_sample_key:
        specs["pooled/output"] = DatasetSpec((5,), "float32", {"dims": ["sample", "feature"]})
    root = {"layers": [f"block.{n}" for n in range(len(widths))], "tokens": "all",
            "packing": True, "max_length": context, "exclude_special": False, **(attrs or {})}
    store = Store(path, config_yaml="model: {}\n", num_rows=len(lengths), datasets=specs,
                  has_target=False, per_position=True, num_positions=total, attrs=root)
    with store:
        first = 0
        for start in range(0, len(lengths), batch):
            counts = lengths[start:start + batch]
            rows = sum(counts)
            values = {key: torch.from_numpy(rng.normal(size=(
                rows if spec.per_position else len(counts), *spec.row_shape)).astype(np.float32))
                .to(_torch_dtype(spec.dtype))
                      for key, spec in specs.items() if spec.dtype.startswith(("float", "bf"))}
            values["input_ids"] = np.arange(first, first + rows, dtype=np.int32) % 97
            values["positions"] = np.concatenate([np.arange(c) for c in counts]).astype(np.int32)
            values["document"] = np.arange(first, first + rows, dtype=np.int64) // 5
            store.append(torch.arange(start, start + len(counts)), None, values,
                         lengths=np.asarray(counts))
            store.commit()
            first += rows
        store.finish()
    return path


def _torch_dtype(dtype: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)


def _read(path: Path, key: str) -> np.ndarray:
    with probe.open(path) as f:  # bfloat16 as float32, as the exports write it
        return f[key].asstr()[:] if h5py.check_string_dtype(f[key].dtype) else f[key][:]


# --- routes

class KeysListed:
    """A route of this module's own: one line per key, its shape."""

    def __init__(self, source, *, seed=None):
        self.source, self.seed = source, seed

    def write(self, folder: Path, budget: int) -> list[tuple[Path, int | None]]:
        lines = [f"{key} {self.source[key].shape} seed={self.seed}" for key in self.source.keys]
        (folder / "keys.txt").write_text("\n".join(lines) + "\n")
        return [(Path("keys.txt"), len(lines))]


def test_a_route_is_looked_up_by_its_name(tmp_path, monkeypatch):
    from probe.file.exports import ROUTES, Route

    monkeypatch.setitem(ROUTES, "keys", Route(__name__, "KeysListed", options=("seed",)))
    path = image_file(tmp_path / "a.h5")
    done = export(path, "keys", seed=3)
    with probe.open(path) as f:
        want = {f"{key} {f[key].shape} seed=3" for key in (CONV, FC)}
    assert set((done.out_dir / "keys.txt").read_text().splitlines()) == want
    with pytest.raises(ConfigError, match="to='csv' is not an export; choose one of npy, "
                                          "parquet, mat, saelens, speculators, keys"):
        export(path, "csv")


# --- npy

def test_npy_mirrors_every_dataset_exactly(tmp_path):
    path = image_file(tmp_path / "a.h5", files=True, dtype="bfloat16")
    done = export(path, "npy")
    out = tmp_path / "a_export"
    assert done.out_dir == out
    for name in ("index", "target", "file", CONV, FC):
        loaded = np.load(out / f"{name}.npy", mmap_mode="r")
        np.testing.assert_array_equal(loaded, _read(path, name), err_msg=name)
    assert np.load(out / f"{CONV}.npy").dtype == np.float32  # bfloat16 bits, as float32
    attrs = json.loads((out / "attrs.json").read_text())
    assert attrs["/"]["config"] == "model: {}\n" and attrs[CONV]["dtype"] == "bfloat16"
    assert {w.path for w in done.files} == {out / f"{n}.npy" for n in (
        "index", "target", "file", CONV, FC)} | {out / "attrs.json"}


def test_npy_of_token_rows_keeps_the_bookkeeping(tmp_path):
    path = token_file(tmp_path / "t.h5")
    export(path, "npy", keys=["block.1"], memory_mb=0.001)
    out = tmp_path / "t_export"
    for name in ("offsets", "input_ids", "positions", "document", "index", "block.1/output"):
        np.testing.assert_array_equal(np.load(out / f"{name}.npy"), _read(path, name))
    assert not (out / "block.0").exists()


# --- parquet

def test_parquet_holds_a_row_per_sample_row(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = image_file(tmp_path / "a.h5", rows=70, compression="gzip")
    export(path, "parquet", memory_mb=0.002)
    table = pq.read_table(tmp_path / "a_export" / "a.parquet")
    assert table.column_names == ["index", "target", FC, CONV]  # the keys in file order
    assert pq.ParquetFile(tmp_path / "a_export" / "a.parquet").metadata.num_row_groups > 1
    for name in ("index", "target"):
        np.testing.assert_array_equal(table[name].to_numpy(), _read(path, name))
    for key in (CONV, FC):
        field = table.schema.field(key)
        shape = tuple(json.loads(field.metadata[b"shape"]))
        values = np.stack(table[key].to_numpy(zero_copy_only=False)).reshape(-1, *shape)
        np.testing.assert_array_equal(values, _read(path, key), err_msg=key)
    assert json.loads(table.schema.field(CONV).metadata[b"dims"])[0] == "sample"


def test_parquet_of_token_rows_names_each_rows_sample(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = token_file(tmp_path / "t.h5")
    export(path, "parquet", memory_mb=0.001)
    table = pq.read_table(tmp_path / "t_export" / "t.parquet")
    assert table.column_names == ["sample", "index", "input_ids", "positions", "document",
                                  "block.0/output", "block.1/output"]
    offsets = _read(path, "offsets")
    samples = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    np.testing.assert_array_equal(table["sample"].to_numpy(), samples)
    np.testing.assert_array_equal(table["index"].to_numpy(), _read(path, "index")[samples])
    for name in ("input_ids", "positions", "document"):
        np.testing.assert_array_equal(table[name].to_numpy(), _read(path, name))
    values = np.stack(table["block.1/output"].to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(values, _read(path, "block.1/output"))


def test_parquet_refuses_keys_of_different_rows(tmp_path):
    path = token_file(tmp_path / "t.h5", per_sample_key=True)
    with pytest.raises(ConfigError, match="different numbers of rows.*pooled/output"):
        export(path, "parquet")
    assert not (tmp_path / "t_export").exists()


# --- mat

def test_mat_holds_every_variable_as_savemat_would(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    path = image_file(tmp_path / "a.h5", rows=9, files=True, dtype="float16")
    export(path, "mat", memory_mb=0.0005)
    loaded = scipy_io.loadmat(tmp_path / "a_export" / "a.mat")
    assert {"index", "target", "features_3_output", "fc_output", "file"} <= set(loaded)
    np.testing.assert_array_equal(loaded["index"], _read(path, "index")[:, None])
    for key, name in ((CONV, "features_3_output"), (FC, "fc_output")):
        assert loaded[name].dtype == np.float32  # MATLAB has no half: single, exactly
        np.testing.assert_array_equal(loaded[name], _read(path, key).astype(np.float32))
    assert [str(c[0]) for c in loaded["file"][:, 0]] == list(_read(path, "file"))


def test_mat_of_token_rows(tmp_path):
    scipy_io = pytest.importorskip("scipy.io")
    path = token_file(tmp_path / "t.h5")
    export(path, "mat", memory_mb=0.0005)
    loaded = scipy_io.loadmat(tmp_path / "t_export" / "t.mat")
    for name in ("offsets", "input_ids", "positions", "document"):
        np.testing.assert_array_equal(loaded[name][:, 0], _read(path, name), err_msg=name)
    np.testing.assert_array_equal(loaded["block_1_output"], _read(path, "block.1/output"))


@pytest.mark.parametrize("array", [
    np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5),
    np.arange(7, dtype=np.int64), np.array([True, False, True]), np.array([5], np.int32),
    np.zeros(0, np.float32), np.zeros((0, 3), np.float32), np.eye(4, 6),
    np.array([[1, 2], [3, 4]], np.uint8)], ids=lambda a: f"{a.dtype}{a.shape}")
def test_mat_variables_are_savemats_bytes(array, tmp_path):
    # the streamed writer against scipy's own, byte for byte, blocks of 2 rows
    scipy_io = pytest.importorskip("scipy.io")
    from probe.file.exports.mat import write_variable

    theirs = io.BytesIO()
    scipy_io.savemat(theirs, {"v": array}, oned_as="column")
    with (tmp_path / "ours.mat").open("w+b") as stream:
        scipy_io.savemat(stream, {})
        write_variable(stream, "v", array.dtype, array.shape,
                       [(a, array[a:a + 2]) for a in range(0, max(1, len(array)), 2)])
    assert (tmp_path / "ours.mat").read_bytes()[128:] == theirs.getvalue()[128:]


def test_mat_names_are_matlabs():
    from probe.file.exports.mat import matlab_names

    long = "encoder.layers." + "x" * 60 + "/output"
    names = matlab_names(["layer4/output", "0.conv/output", long, "a.b/output", "a_b/output",
                          "index"])
    assert names["layer4/output"] == "layer4_output" and names["index"] == "index"
    assert names["0.conv/output"] == "x0_conv_output"
    assert len(names[long]) == 63 and names[long] != names["a.b/output"]
    assert names["a.b/output"] == "a_b_output" and names["a_b/output"].startswith("a_b_output_")
    assert all(n[0].isalpha() and len(n) <= 63 for n in names.values())
    assert len(set(names.values())) == len(names)


def test_mat_refuses_a_key_over_two_gib(tmp_path, monkeypatch):
    from probe.file.exports import mat

    monkeypatch.setattr(mat, "MAX_VARIABLE_BYTES", 200)
    path = image_file(tmp_path / "a.h5")
    with pytest.raises(ConfigError, match=r"more than the 2 GiB.*h5read\('a.h5', "
                                          r"'/features.3/output'\)"):
        export(path, "mat", keys=[CONV])
    assert not list(tmp_path.glob("a_export*")) and not list(tmp_path.glob(".a_export*"))


# --- what every route shares

def test_a_real_run_exports_by_every_route(tmp_path):
    path = probe.run(compose_cfg(*TINY_NET, "layers=[features.3,fc]", output=tmp_path / "r.h5"))
    for to in ("npy", "parquet", "mat"):
        done = export(path, to, out_dir=tmp_path / to)
        assert all(w.path.is_file() and w.bytes > 0 for w in done.files)
    np.testing.assert_array_equal(np.load(tmp_path / "npy" / "features.3" / "output.npy"),
                                  _read(path, CONV))


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """32 MiB of rows, in lzf chunks of 32 rows (128 KiB)."""
    return image_file(tmp_path_factory.mktemp("big") / "big.h5", rows=8192, shape=(1024,),
                      compression="lzf", batch=1024)


@pytest.mark.parametrize("to", ["npy", "parquet", "mat"])
def test_memory_stays_within_the_budget(to, big_file, tmp_path):
    # numpy's buffers are traced (h5py reads into them); the file is 64 times the budget
    size = 8192 * 1024 * 4
    tracemalloc.start()
    try:
        export(big_file, to, keys=[CONV], memory_mb=0.5, out_dir=tmp_path / to)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20 and peak < size / 8, f"{peak / 2**20:.1f} MiB"


def test_the_folder_is_whole_or_absent(tmp_path, monkeypatch):
    from probe.file.exports import npy

    path = image_file(tmp_path / "a.h5")
    out = tmp_path / "out"
    export(path, "npy", out_dir=out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    calls = []

    def fail_on_the_third(self, name, target, budget):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(self, name, target, budget)

    original = npy.NpyExport._write
    monkeypatch.setattr(npy.NpyExport, "_write", fail_on_the_third)
    with pytest.raises(OutputError, match="No space left on device"):
        export(path, "npy", out_dir=out, overwrite=True)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # the old one, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "out"]  # no hidden folder
    monkeypatch.undo()
    done = export(path, "npy", out_dir=out, overwrite=True, keys=[FC])
    assert not (out / "features.3").exists() and len(done.files) == 4  # replaced


@pytest.mark.parametrize("call, error, match", [
    (dict(to="csv"), ConfigError, "to='csv' is not an export; choose one of npy, parquet, "
                                  "mat, saelens"),
    (dict(to="npy", keys=["layer9/output"]), ConfigError, "'layer9/output' is not in"),
    (dict(to="npy", keys=[]), ConfigError, "keys=.. names no key"),
    (dict(to="npy", names={"fc": "x"}), ConfigError, "names= names the columns of "
                                                     "to=saelens"),
    (dict(to="npy", memory_mb=0), ConfigError, "memory_mb=0 must be more than 0"),
    (dict(to="saelens"), ConfigError, "needs a packed text run .dataset.packing=true"),
])
def test_refusals(call, error, match, tmp_path):
    path = image_file(tmp_path / "a.h5")
    with pytest.raises(error, match=match):
        export(path, **call)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5"]


def test_partial_missing_and_foreign_files_are_refused(tmp_path):
    partial = image_file(tmp_path / "p.h5", finish=False)
    with pytest.raises(OutputError, match="is not finished"):
        export(partial, "npy")
    with pytest.raises(DataError, match="does not exist"):
        export(tmp_path / "nothing.h5", "npy")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(DataError, match="is not a probe file"):
        export(tmp_path / "plain.h5", "npy")
    assert not list(tmp_path.glob("*_export"))


def test_out_dir_refusals(tmp_path):
    path = image_file(tmp_path / "a.h5")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="out_dir=.*full' is not empty; choose another "
                                          "out_dir, or add overwrite=true"):
        export(path, "npy", out_dir=tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    with pytest.raises(OutputError, match="holds file="):
        export(path, "npy", out_dir=tmp_path, overwrite=True)
    assert path.is_file()
    (tmp_path / "empty").mkdir()
    export(path, "npy", out_dir=tmp_path / "empty")  # an empty folder is fine
    assert (tmp_path / "empty" / "index.npy").is_file()


def test_the_command_runs_from_another_folder_and_says_what_it_wrote(tmp_path):
    (tmp_path / "data").mkdir()
    path = image_file(tmp_path / "data" / "a.h5")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli(f"file={path}", "to=npy", "keys=[fc]", cwd=elsewhere, module="probe.export")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "data" / "a_export"  # beside the file, not in the working folder
    assert f"{out / 'fc' / 'output.npy'}  10 rows  " in done.stdout
    assert "to=npy: wrote 4 files" in done.stdout and not list(elsewhere.iterdir())
    np.testing.assert_array_equal(np.load(out / "fc" / "output.npy"), _read(path, FC))
    again = cli(f"file={path}", "to=npy", cwd=elsewhere, module="probe.export")
    assert "is not empty" in error_line(again)
    for args, says in ((["to=npy"], "file is not set; pass file="),
                       ([f"file={path}"], "to is not set; pass to=npy|parquet|mat|saelens"),
                       ([f"file={path}", "to=npy", "keys=[nope]"], "'nope' is not in"),
                       ([f"file={path}.partial", "to=npy"], "does not exist")):
        assert says in error_line(cli(*args, cwd=elsewhere, module="probe.export"))


def test_the_functions_defaults_are_the_commands():
    from probe.file.exports.config import ExportConfig

    fields = {f.name: f.default for f in dataclasses.fields(ExportConfig)}
    parameters = inspect.signature(export).parameters
    shared = [p for p in parameters.values() if p.default is not inspect.Parameter.empty]
    assert {p.name for p in shared} == set(fields) - {"file", "to"}
    assert all(p.default == fields[p.name] for p in shared)


@pytest.mark.slow
@pytest.mark.parametrize("to", ["npy", "parquet", "mat", "saelens"])
def test_a_four_times_larger_file_adds_no_memory(to, tmp_path):
    # the whole process (arrow's own allocations too): peak resident memory of two exports
    code = ("import sys\nfrom probe.file.exports import export\n"
            "export(sys.argv[1], sys.argv[2], out_dir=sys.argv[3], memory_mb=2)\n"
            "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n")
    peaks = []
    for n, windows in enumerate((1024, 4096)):
        path = token_file(tmp_path / f"{n}.h5", windows=windows, context=8, widths=(1024,),
                          last=None, batch=256)
        done = subprocess.run([sys.executable, "-c", code, str(path), to, str(tmp_path / str(n))],
                              capture_output=True, text=True, check=True)
        peaks.append(int(done.stdout.split()[-1]) / 1024)
    assert peaks[1] - peaks[0] < 20, peaks  # MiB, for 96 MiB more of rows


def test_parquet_holds_each_samples_text_as_a_string_column(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = image_file(tmp_path / "f.h5", rows=9, files=True)
    export(path, "parquet", memory_mb=0.001)
    table = pq.read_table(tmp_path / "f_export" / "f.parquet")
    assert table.column_names[:3] == ["index", "target", "file"]
    assert table.schema.field("file").type == "string"
    assert table["file"].to_pylist() == [f"cat/{n}.png" for n in range(9)]


def test_parquet_of_token_rows_gives_each_row_its_samples_text(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = token_file(tmp_path / "t.h5")
    with h5py.File(path, "r+") as f:  # a string a sample, as a generation run's /completion
        count = len(f["index"])
        f.create_dataset("completion", data=[f"answer {n}" for n in range(count)],
                         dtype=h5py.string_dtype())
    export(path, "parquet", memory_mb=0.001)
    table = pq.read_table(tmp_path / "t_export" / "t.parquet")
    samples = table["sample"].to_numpy()
    assert table["completion"].to_pylist() == [f"answer {n}" for n in samples]
