"""python -m probe.export against reading the same bytes with h5py and writing them raw.

    python benchmarks/bench_export.py                  # 2 GiB of image rows, 1 GiB of text rows
    python benchmarks/bench_export.py --gib 0.25 --text-gib 0.125 --repeat 1 --memory-mb 4  # quick

Two files, made by probe's own store (uncompressed, as a run writes them by default):

- image rows: two conv maps of (256, 8, 8) float32 per sample (64 KiB each, so that each is
  under MATLAB v5's 2 GiB a variable), ``--gib`` in all;
- a packed text run: 4 layers of width 768, windows of 128 tokens, ``--text-gib`` in all.

Each route (npy, parquet, mat; saelens for the text file) runs in a fresh process, and so does
its baseline: h5py reads the exported keys in blocks of the same budget (``--memory-mb``) and
writes each block's bytes to a file as they are. The ratio is baseline seconds / export
seconds (throughput, target >= 0.8), the seconds those after the imports. Peak memory is each
process's VmHWM above its imports, on the file and on one 4 times smaller (target: the
larger file adds < 50 MB). The saelens shuffle is also timed against an in-memory
permutation: the file's windows read whole, permuted with numpy, written raw.

Beside them, each format's own library writes the same keys from memory (read first, not
timed; ``--no-library`` leaves it out): pyarrow's ``write_table``, ``scipy.io.savemat``,
``np.save``, datasets' ``save_to_disk`` of the unshuffled windows. ``vs lib`` is library seconds
/ export seconds: where the format's encoding itself costs more than a raw write (Parquet's
repetition levels, MATLAB's column-major order), that is the floor an export can reach.

Medians of ``--repeat`` runs, export and baseline alternating. The input files stay in the
page cache (both sides read from memory); both sides fsync what they write (the export does,
before it renames its folder into place), so the seconds include the disk. The machine may be
shared and noisy: compare the ratios, and note the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's probe, as the measured processes use

IMAGE_KEYS = ("layer3/output", "layer4/output")
TEXT_LAYERS, WIDTH, CONTEXT = 4, 768, 128

_PEAK = ("def peak():\n"
         "    text = open('/proc/self/status').read()\n"
         "    return int(text.split('VmHWM:')[1].split()[0]) * 1024\n")

_EXPORT = _PEAK + """
import json, sys, time
from probe.file.exports import export
import pyarrow, pyarrow.parquet, scipy.io, datasets  # imports outside the timed part
start = peak()
began = time.perf_counter()
done = export(sys.argv[1], sys.argv[2], out_dir=sys.argv[3], memory_mb=float(sys.argv[4]))
print(json.dumps({"seconds": time.perf_counter() - began, "peak": peak(), "imports": start,
                  "bytes": done.bytes}))
"""

_RAW = _PEAK + """
import json, sys, time, os
import h5py, numpy as np
start = peak()
began = time.perf_counter()
budget, written = int(float(sys.argv[4]) * 2**20), 0
os.makedirs(sys.argv[3])
with h5py.File(sys.argv[1], "r") as f:
    keys = [f"{g}/{k}" for g in f if isinstance(f[g], h5py.Group) for k in f[g]]
    for n, key in enumerate(keys):
        dataset = f[key]
        step = max(1, budget // (dataset.dtype.itemsize * int(np.prod(dataset.shape[1:]))))
        with open(os.path.join(sys.argv[3], f"{n}.raw"), "wb") as out:
            for a in range(0, len(dataset), step):
                block = dataset[a:a + step]
                out.write(block.data)
                written += block.nbytes
                del block
            out.flush()
            os.fsync(out.fileno())
print(json.dumps({"seconds": time.perf_counter() - began, "peak": peak(), "imports": start,
                  "bytes": written}))
"""

_PERMUTE = _PEAK + """
import json, sys, time, os
import h5py, numpy as np
start = peak()
began = time.perf_counter()
os.makedirs(sys.argv[3])
written = 0
with h5py.File(sys.argv[1], "r") as f:
    offsets = f["offsets"][:]
    full = np.flatnonzero(np.diff(offsets) == int(f.attrs["max_length"]))
    order = full[np.random.default_rng(0).permutation(len(full))]
    keys = [f"{g}/{k}" for g in f if isinstance(f[g], h5py.Group) for k in f[g]]
    for n, key in enumerate([*keys, "input_ids"]):
        rows = f[key][:]                                   # the whole key in memory
        windows = rows[:len(full) * int(f.attrs["max_length"])].reshape(len(full), -1)
        shuffled = windows[order]
        with open(os.path.join(sys.argv[3], f"{n}.raw"), "wb") as out:
            out.write(shuffled.data)
            out.flush()
            os.fsync(out.fileno())
        written += shuffled.nbytes
        del rows, windows, shuffled
print(json.dumps({"seconds": time.perf_counter() - began, "peak": peak(), "imports": start,
                  "bytes": written}))
"""


# the format's own library writing the same keys from memory (read first, not timed): what an
# export could reach at best with that library, whose encoding (Parquet's repetition levels,
# MATLAB's column-major order) costs what a raw write does not
_LIBRARY = _PEAK + """
import json, sys, time, os
import h5py, numpy as np
os.makedirs(sys.argv[3])
route, out = sys.argv[2], sys.argv[3]
with h5py.File(sys.argv[1], "r") as f:
    keys = [f"{g}/{k}" for g in f if isinstance(f[g], h5py.Group) for k in f[g]]
    arrays = {key: f[key][:] for key in keys}
    index = f["index"][:]
if route == "parquet":
    import pyarrow as pa, pyarrow.parquet as pq
elif route == "mat":
    from scipy.io import savemat
else:
    import datasets, pyarrow as pa
start = peak()
began = time.perf_counter()
written = sum(a.nbytes for a in arrays.values())
if route == "npy":
    for n, array in enumerate(arrays.values()):
        np.save(os.path.join(out, f"{n}.npy"), array)
elif route == "parquet":
    # one row group of the whole table when it holds rows per sample, else a table a key
    for n, (key, array) in enumerate(arrays.items()):
        flat = pa.array(array.reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(array.shape[1:])))
        pq.write_table(pa.table({key: column}), os.path.join(out, f"{n}.parquet"),
                       compression="none", use_dictionary=False, write_statistics=False)
elif route == "mat":
    savemat(os.path.join(out, "all.mat"), {f"k{n}": a for n, a in enumerate(arrays.values())})
else:  # saelens: the windows, unshuffled, through datasets' own save_to_disk
    context = 128
    columns = {}
    for key, array in arrays.items():
        whole = array[: len(array) // context * context]
        flat = pa.array(whole.reshape(-1))
        inner = pa.FixedSizeListArray.from_arrays(flat, array.shape[1])
        columns[key] = pa.FixedSizeListArray.from_arrays(inner, context)
    datasets.Dataset(pa.table(columns)).save_to_disk(out)
for root, _, names in os.walk(out):
    for name in names:
        with open(os.path.join(root, name), "rb+") as stream:
            os.fsync(stream.fileno())
print(json.dumps({"seconds": time.perf_counter() - began, "peak": peak(), "imports": start,
                  "bytes": written}))
"""


def image_file(path: Path, gib: float) -> Path:
    """Image rows of two (256, 8, 8) float32 keys, ``gib`` GiB in all."""
    import torch

    from probe.file.format import DatasetSpec
    from probe.file.store import Store

    row_shape = (256, 8, 8)
    rows = max(64, int(gib * 2**30 / (2 * 4 * np.prod(row_shape))))
    dims = {"dims": ["sample", "channel", "height", "width"], "dtype": "float32"}
    specs = {key: DatasetSpec(row_shape, "float32", dims) for key in IMAGE_KEYS}
    base = np.random.default_rng(0).normal(size=(256, *row_shape)).astype(np.float32)
    with Store(path, config_yaml="{}", num_rows=rows, datasets=specs,
               attrs={"layers": [k.split("/")[0] for k in IMAGE_KEYS]}) as store:
        for start in range(0, rows, 256):
            stop = min(rows, start + 256)
            block = torch.from_numpy(base[:stop - start] + np.float32(start))
            store.append(torch.arange(start, stop), torch.arange(start, stop) % 10,
                         {key: block for key in IMAGE_KEYS})
            store.commit()
        store.finish()
    return path


def text_file(path: Path, gib: float) -> Path:
    """A packed text run: 4 layers of width 768, windows of 128 tokens (the last shorter)."""
    import torch

    from probe.file.format import DatasetSpec
    from probe.file.store import Store

    token = {"dims": ["token"]}
    windows = max(8, int(gib * 2**30 / (TEXT_LAYERS * WIDTH * 4 * CONTEXT)))
    lengths = [CONTEXT] * (windows - 1) + [CONTEXT // 2]
    specs = {f"transformer.h.{n}/output": DatasetSpec(
        (WIDTH,), "float32", {"dims": ["token", "feature"], "dtype": "float32"},
        per_position=True) for n in range(TEXT_LAYERS)}
    specs.update({name: DatasetSpec((), kind, token, compressible=False, per_position=True)
                  for name, kind in (("input_ids", "int32"), ("positions", "int32"),
                                     ("document", "int64"))})
    base = np.random.default_rng(1).normal(size=(16 * CONTEXT, WIDTH)).astype(np.float32)
    attrs = {"layers": [f"transformer.h.{n}" for n in range(TEXT_LAYERS)], "tokens": "all",
             "packing": True, "max_length": CONTEXT, "exclude_special": False}
    with Store(path, config_yaml="{}", num_rows=windows, datasets=specs, has_target=False,
               per_position=True, num_positions=sum(lengths), attrs=attrs) as store:
        first = 0
        for start in range(0, windows, 16):
            counts = lengths[start:start + 16]
            rows = sum(counts)
            block = torch.from_numpy(base[:rows] + np.float32(start))
            values = {key: block for key in specs if key.endswith("/output")}
            values["input_ids"] = np.arange(first, first + rows, dtype=np.int32) % 50257
            values["positions"] = np.concatenate([np.arange(c) for c in counts]).astype(np.int32)
            values["document"] = np.arange(first, first + rows, dtype=np.int64) // 300
            store.append(torch.arange(start, start + len(counts)), None, values,
                         lengths=np.asarray(counts))
            store.commit()
            first += rows
        store.finish()
    return path


def run(code: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                                      "TQDM_DISABLE": "1"})
    if result.returncode:
        raise SystemExit(result.stderr)
    return json.loads(result.stdout)


def measure(code: str, file: Path, route: str, out: Path, memory_mb: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    try:
        return run(code, file, route, out, memory_mb)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def compare(name: str, file: Path, small: Path, route: str, work: Path, args) -> None:
    ours, raw, library = [], [], []
    for _ in range(args.repeat):
        ours.append(measure(_EXPORT, file, route, work / "out", args.memory_mb))
        raw.append(measure(_RAW, file, route, work / "out", args.memory_mb))
        if args.library:
            library.append(measure(_LIBRARY, file, route, work / "out", args.memory_mb))
    little = measure(_EXPORT, small, route, work / "out", args.memory_mb)
    mib = 2**20
    seconds, baseline = median(ours, "seconds"), median(raw, "seconds")
    floor = (f"{median(library, 'seconds'):10.2f}{median(library, 'seconds') / seconds:8.2f}"
             if library else f"{'-':>10}{'-':>8}")
    grown = (median(ours, "peak") - median(ours, "imports")) - (little["peak"]
                                                                 - little["imports"])
    rates = median(raw, "bytes") / baseline / mib, median(ours, "bytes") / seconds / mib
    print(f"{name:18}{route:9}{seconds:9.2f}{baseline:10.2f}{baseline / seconds:8.2f}"
          f"{rates[0]:10.0f}{rates[1]:10.0f}"
          f"{(median(ours, 'peak') - median(ours, 'imports')) / mib:11.0f}"
          f"{(little['peak'] - little['imports']) / mib:11.0f}{grown / mib:9.0f}{floor}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="the image-rows file's size")
    parser.add_argument("--text-gib", type=float, default=1.0, help="the text file's size")
    parser.add_argument("--memory-mb", type=float, default=64,
                        help="the budget: below the keys of the 4 times smaller file too, so "
                             "that both files are streamed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--routes", default="npy,parquet,mat,saelens")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--no-library", dest="library", action="store_false",
                        help="leave out the format's library writing from memory (it holds "
                             "the whole file in memory)")
    args = parser.parse_args()
    routes = args.routes.split(",")
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        work = Path(folder)
        images = image_file(work / "images.h5", args.gib)
        images_small = image_file(work / "images_small.h5", args.gib / 4)
        text = text_file(work / "text.h5", args.text_gib)
        text_small = text_file(work / "text_small.h5", args.text_gib / 4)
        print(f"image rows {images.stat().st_size / 2**30:.2f} GiB, text rows "
              f"{text.stat().st_size / 2**30:.2f} GiB; memory_mb={args.memory_mb:g}; medians of "
              f"{args.repeat}; load {os.getloadavg()[0]:.2f} at the start")
        print(f"{'file':18}{'route':9}{'export s':>9}{'h5py+raw':>10}{'ratio':>8}"
              f"{'raw MiB/s':>10}{'exp MiB/s':>10}{'peak MiB':>11}{'1/4 file':>11}{'grows':>9}"
              f"{'library s':>10}{'vs lib':>8}")
        for route in routes:
            if route != "saelens":
                compare("image rows", images, images_small, route, work, args)
            compare("packed text", text, text_small, route, work, args)
        if "saelens" in routes:
            shuffled = [measure(_EXPORT, text, "saelens", work / "out", args.memory_mb)
                        for _ in range(args.repeat)]
            memory = [measure(_PERMUTE, text, "saelens", work / "out", args.memory_mb)
                      for _ in range(args.repeat)]
            mib, ours, theirs = 2**20, median(shuffled, "seconds"), median(memory, "seconds")
            print(f"saelens shuffle {ours:.2f} s, peak "
                  f"{(median(shuffled, 'peak') - median(shuffled, 'imports')) / mib:.0f} MiB above "
                  f"imports; in-memory permutation {theirs:.2f} s, peak "
                  f"{(median(memory, 'peak') - median(memory, 'imports')) / mib:.0f} MiB; ratio "
                  f"(in-memory / shuffle) {theirs / ours:.2f}")
        print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
