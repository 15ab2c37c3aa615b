"""probe against the bare model loop and the raw disk write, measured in one process.

    python benchmarks/bench.py                 # every case (about 10 minutes on 2 CPU cores)
    python benchmarks/bench.py --case light    # one: light, heavy, grad, memory, startup, vit
    python benchmarks/bench.py --device cuda --case light --case heavy --case grad   # on a GPU

Each timed case runs probe and its baseline alternately ``--repeat`` times on the same model
object, data and disk, and prints medians and their ratio. The machine may be shared and noisy:
compare the ratios, not the seconds. Numbers for the README come from this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

import torch
from peak import peak_rss_mib  # a sibling module: a script's own folder is on sys.path
from torch import nn

import probe
from probe.config.compose import compose
from probe.data.feed import Batching
from probe.data.images import SyntheticImages
from probe.data.tensors import TensorFeed
from probe.file.format import DatasetSpec
from probe.file.store import Store

REPO = Path(__file__).resolve().parent.parent
DEVICE = torch.device("cpu")  # --device: where the model runs, for probe and the baselines alike


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def _cfg(overrides: list[str], out: Path):
    return compose([*overrides, f"output.path={out}", "output.overwrite=true",
                    f"device={DEVICE}"])


DRY_RUNS: list[float] = []  # seconds of each probe run's one-sample dry run, newest last


def _probe_run(model: nn.Module, dataset, overrides: list[str], out: Path) -> float:
    """Seconds for plan + execute, with the model and dataset built once outside the timing."""
    cfg = _cfg(overrides, out)  # composing is start-up (case 5), not the run
    try:
        started = time.perf_counter()
        plan = probe.plan(cfg, model=model, dataset=dataset)
        probe.execute(plan)
        DRY_RUNS.append(plan.dry_run_seconds)
        return time.perf_counter() - started
    finally:
        out.unlink(missing_ok=True)


def _batches(dataset, batch_size: int):
    """The images of each batch, as probe's loader makes them."""
    loader = TensorFeed().loader(dataset, list(range(len(dataset))),
                                 Batching(batch_size, pin_memory=DEVICE.type == "cuda"))
    return (batch.inputs for batch in loader)


def _bare_forward(head: nn.Module, dataset, batch_size: int) -> float:
    """The model up to the last hooked layer, keeping nothing."""
    started = time.perf_counter()
    with torch.inference_mode():
        for x in _batches(dataset, batch_size):
            head(x.to(DEVICE, non_blocking=True))
    _sync()
    return time.perf_counter() - started


def _raw_write(nbytes_per_row: int, rows: int, batch_size: int, directory: Path) -> float:
    """Writing the same number of bytes with numpy to the same disk, batch by batch."""
    block = torch.rand(batch_size, nbytes_per_row // 4).numpy()
    path = directory / "raw.bin"
    started = time.perf_counter()
    with open(path, "wb") as f:
        for start in range(0, rows, batch_size):
            block[: min(batch_size, rows - start)].tofile(f)
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def _store_write(layers: int, rows: int, batch_size: int, directory: Path) -> float:
    """probe's store alone writing the same rows of ``layers`` (64, 224, 224) maps (no compute,
    no thread): what it takes over the raw write is HDF5's cost."""
    block = torch.rand(batch_size, 64, 224, 224)
    path = directory / "store.h5"
    started = time.perf_counter()
    specs = {f"layer{i}/output": DatasetSpec((64, 224, 224), "float32") for i in range(layers)}
    with Store(path, config_yaml="{}", num_rows=rows, datasets=specs) as store:
        for batch, start in enumerate(range(0, rows, batch_size)):
            index = torch.arange(start, min(start + batch_size, rows))
            store.append(index, index, {key: block[:len(index)] for key in specs})
            if batch % 8 == 7:  # as the writer commits by default
                store.commit()
        store.finish()
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def _compute_and_write_at_once(head: nn.Module, dataset, nbytes_per_row: int, batch_size: int,
                               directory: Path) -> float:
    """The bare compute and the raw write side by side in two threads: what a machine can do at
    best when both must happen (on 2 cores they compete; with a GPU they need not)."""
    writer = threading.Thread(target=_raw_write,
                              args=(nbytes_per_row, len(dataset), batch_size, directory))
    started = time.perf_counter()
    writer.start()
    _bare_forward(head, dataset, batch_size)
    writer.join()
    return time.perf_counter() - started


def _median_pair(first, second, repeat: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(repeat):
        a.append(first())
        b.append(second())
    return statistics.median(a), statistics.median(b)


def _report(name: str, probe_s: float, base_name: str, base_s: float, target: float,
            unit: str = "s") -> None:
    ratio = probe_s / base_s
    verdict = "meets" if ratio <= target else "MISSES"
    print(f"{name:<34} probe {probe_s:7.2f} {unit}  {base_name} {base_s:7.2f} {unit}  "
          f"ratio {ratio:5.2f} ({verdict} <= {target:.2f})", flush=True)


def _vgg16() -> nn.Module:
    torch.manual_seed(0)
    import torchvision

    return torchvision.models.vgg16().eval().to(DEVICE)


def case_light(args, directory: Path) -> None:
    model, data = _vgg16(), SyntheticImages(args.samples * 2, 224)
    head = model.features[:29]
    overrides = ["model=vgg16", "layers=[features.28]", f"batch_size={args.batch}"]
    p, b = _median_pair(lambda: _probe_run(model, data, overrides, directory / "f.h5"),
                        lambda: _bare_forward(head, data, args.batch), args.repeat)
    _report("1 I/O-light vgg16 features.28", p, "bare", b, 1.05)


def case_heavy(args, directory: Path) -> None:
    model, data = _vgg16(), SyntheticImages(args.samples * 4, 224)
    for layers, upto in (("features.0", 1), ("features.0,features.2", 3)):
        overrides = ["model=vgg16", f"layers=[{layers}]", f"batch_size={args.batch}"]
        row = 64 * 224 * 224 * 4 * len(layers.split(","))
        head = model.features[:upto]
        DRY_RUNS.clear()
        p, b = _median_pair(
            lambda o=overrides: _probe_run(model, data, o, directory / "f.h5"),
            lambda h=head: _bare_forward(h, data, args.batch), args.repeat)
        dry = statistics.median(DRY_RUNS)
        w = statistics.median(_raw_write(row, len(data), args.batch, directory)
                              for _ in range(args.repeat))
        stored = statistics.median(
            _store_write(len(layers.split(",")), len(data), args.batch, directory)
            for _ in range(args.repeat))
        both = statistics.median(
            _compute_and_write_at_once(head, data, row, args.batch, directory)
            for _ in range(args.repeat))
        print(f"  {len(data)} samples: write floor {w:.2f} s for {row * len(data) / 2**30:.2f} "
              f"GiB ({row * len(data) / w / 2**30:.2f} GiB/s), probe's store alone {stored:.2f} "
              f"s; bare compute {b:.2f} s; both at once in two threads {both:.2f} s; probe's "
              f"one-sample dry run (a fixed cost per run) {dry:.2f} s")
        _report(f"2 I/O-heavy vgg16 {layers}", p, "max(bare, write)", max(b, w), 1.15)
        _report("  without the dry run", p - dry, "max(bare, write)", max(b, w), 1.15)
        _report("  against both at once", p, "both at once", both, 1.15)


def _bare_grad(model: nn.Module, dataset, batch_size: int) -> float:
    """Forward + backward that differentiates top1 with respect to features.28's output only."""
    features = model.features
    rest = nn.Sequential(nn.ReLU(), features[30:], model.avgpool, nn.Flatten(), model.classifier)
    for p in model.parameters():
        p.requires_grad_(False)
    started = time.perf_counter()
    for x in _batches(dataset, batch_size):
        with torch.no_grad():
            conv = features[:29](x.to(DEVICE, non_blocking=True))
        conv.requires_grad_(True)
        logits = rest(conv)
        objective = logits.gather(1, logits.argmax(1, keepdim=True)).sum()
        torch.autograd.grad(objective, conv)
    _sync()
    elapsed = time.perf_counter() - started
    for p in model.parameters():
        p.requires_grad_(True)
    return elapsed


def case_grad(args, directory: Path) -> None:
    model, data = _vgg16(), SyntheticImages(args.samples, 224)
    overrides = ["model=vgg16", "layers=[features.28]", "hooks=[forward,backward]",
                 f"batch_size={args.batch}"]
    p, b = _median_pair(lambda: _probe_run(model, data, overrides, directory / "f.h5"),
                        lambda: _bare_grad(model, data, args.batch), args.repeat)
    _report("3 gradients vgg16 features.28", p, "bare fwd+bwd", b, 1.10)


def _peak_rss_mib(samples: int, directory: Path) -> float:
    out = directory / f"rss{samples}.h5"
    peak = peak_rss_mib(
        "import probe\nfrom probe.config.compose import compose\n"
        f"cfg = compose(['model=resnet18', 'layers=[layer1]', 'batch_size=16',\n"
        f"    'dataset.num_samples={samples}', 'output.path={out}'])\n"
        "probe.run(cfg)")
    out.unlink()
    return peak


def case_memory(args, directory: Path) -> None:
    small, large = args.samples * 2, args.samples * 16
    one = statistics.median(_peak_rss_mib(small, directory) for _ in range(args.repeat))
    eight = statistics.median(_peak_rss_mib(large, directory) for _ in range(args.repeat))
    print(f"  resnet18 layer1 (784 KiB/sample): peak RSS {one:.0f} MiB for {small} samples, "
          f"{eight:.0f} MiB for {large}")
    _report("4 peak RSS, 8x the samples", eight, "1x", one, 1.10, unit="MiB")


def case_startup(args, directory: Path) -> None:
    def wall(code: list[str]) -> float:
        started = time.perf_counter()
        subprocess.run(code, cwd=directory, check=True, capture_output=True)
        return time.perf_counter() - started

    cli = [sys.executable, "-m", "probe", "model=resnet18", "layers=[fc]", "limit=1",
           "dataset.image_size=32", f"output.path={directory}/s.h5", "output.overwrite=true"]
    imports = [sys.executable, "-c", "import torch, torchvision"]
    build = [sys.executable, "-c", "import torch, torchvision, time; t = time.perf_counter(); "
             "torchvision.models.resnet18(); print(time.perf_counter() - t)"]
    runs = [(wall(cli), wall(imports)) for _ in range(args.repeat)]
    cli_s = statistics.median(r[0] for r in runs)
    import_s = statistics.median(r[1] for r in runs)
    model_s = float(subprocess.run(build, capture_output=True, text=True).stdout)
    print(f"5 start-up: python -m probe, 1 sample, whole run {cli_s:.2f} s; of it "
          f"import torch+torchvision {import_s:.2f} s, resnet18 construction {model_s:.2f} s; "
          f"probe's own share {cli_s - import_s - model_s:.2f} s")


def case_vit(args, directory: Path) -> None:
    """timm's vit_tiny at 224 px, the class token after the middle block (blocks.5 of 12)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224").eval().to(DEVICE)
    data = SyntheticImages(args.samples * 8, 224)  # a fast model: enough to time the loop

    def head(x):  # the model's own forward_features, up to blocks.5
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        return model.blocks[:6](x)

    overrides = ["model=timm", "model.name=vit_tiny_patch16_224", "layers=[blocks.5]",
                 "tokens=first", f"batch_size={args.batch}"]
    p, b = _median_pair(lambda: _probe_run(model, data, overrides, directory / "f.h5"),
                        lambda: _bare_forward(head, data, args.batch), args.repeat)
    _report("6 timm ViT blocks.5, class token", p, "bare", b, 1.05)


CASES = {"light": case_light, "heavy": case_heavy, "grad": case_grad, "memory": case_memory,
         "startup": case_startup, "vit": case_vit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where files go (default: tmp)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's intra-op threads (default: torch's choice, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(f"torch {torch.__version__} on {DEVICE}, {torch.get_num_threads()} threads, "
          f"{args.samples} samples, batch {args.batch}, median of {args.repeat}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in args.case or list(CASES):
            CASES[name](args, Path(tmp))


if __name__ == "__main__":
    main()
