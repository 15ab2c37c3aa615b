"""probe on a Hugging Face vision transformer against the bare loop, measured in one process.

    python benchmarks/bench_vision_hf.py                    # both cases (minutes on 2 CPU cores)
    python benchmarks/bench_vision_hf.py --case forward --images 64

A ViT-B-shaped ViTModel with random weights (hidden 768, 12 blocks, 12 heads, 224 px images in
16 px patches: 197 tokens), saved with save_pretrained beside its image processor and run as
``model=transformers`` with ``tokens=first`` (the class token) at block 6 (``layers.6``), in
batches of 32:

    forward  probe against the bare loop: the same model object cut after block 6, on the same
             batches (made once, outside the timing), keeping nothing. Medians of --repeat
             alternating runs
    memory   peak RSS of a probe run (each in its own process) on 1x and 4x the images, read
             from PNG files through the checkpoint's own image processor (dataset.transform=auto)

The machine may be noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from probe.data.tensors import TensorFeed  # noqa: E402

LAYER, BLOCK, BATCH = "layers.6", 6, 32


def vit_b(directory: Path) -> Path:
    """A ViT-B/16 at 224 px with random weights (seeded), and its image processor."""
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072, image_size=224, patch_size=16,
                       architectures=["ViTModel"])
    ViTModel(config, add_pooling_layer=False).save_pretrained(directory)
    ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(directory)
    return directory


class Pixels(Dataset):
    """Preprocessed images: (3, 224, 224) tensors, as the image processor makes them."""

    def __init__(self, count: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(count, 3, 224, 224, generator=generator)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.images[index]


def png_folder(root: Path, count: int) -> Path:
    """``count`` PNG files of 256 x 256 random pixels, in two class folders."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for n in range(count):
        folder = root / f"class{n % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(
            folder / f"{n}.png")
    return root


def _cfg(model_dir: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}",
                    f"layers=[{LAYER}]", "tokens=first", f"batch_size={BATCH}",
                    f"output.path={out}", "output.overwrite=true", "device=cpu",
                    *extra])


def probe_run(cfg, model, dataset) -> tuple[float, float]:
    """Seconds of the whole run, and of its plan (checks, weight fingerprint, dry run)."""
    started = time.perf_counter()
    planned = probe.plan(cfg, model=model, dataset=dataset)
    planning = time.perf_counter() - started
    probe.execute(planned)
    elapsed = time.perf_counter() - started
    Path(cfg.output.path).unlink()
    return elapsed, planning


def bare_forward(head, batches) -> float:
    """The model cut after block 6 (its own forward) on each batch, the class token's row
    taken, nothing kept."""
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            head(pixel_values=batch.inputs).last_hidden_state[:, 0].clone()
    return time.perf_counter() - started


def folder_peak_mib(model_dir: Path, images: Path, out: Path) -> float:
    peak = peak_rss_mib(f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                        "from benchmarks.bench_vision_hf import _cfg\nimport probe\n"
                        "from pathlib import Path\n"
                        f"probe.run(_cfg(Path({str(model_dir)!r}), Path({str(out)!r}), "
                        f"'dataset=imagefolder', 'dataset.root={images}'))")
    out.unlink()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["forward", "memory"], action="append")
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--memory-images", type=int, default=None,
                        help="the 1x of the memory case (default: --images)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import ViTModel

    cases = args.case or ["forward", "memory"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = vit_b(tmp / "vit")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ViT-B/16 at 224 "
              f"px, tokens=first at {LAYER}, batches of {BATCH}", flush=True)
        if "forward" in cases:
            model = ViTModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
            dataset = Pixels(args.images)
            batches = list(TensorFeed().loader(dataset, list(range(len(dataset))),
                                               Batching(BATCH)))
            head = copy.deepcopy(model)
            head.layers = head.layers[:BLOCK + 1]  # the model up to block 6
            cfg = _cfg(model_dir, tmp / "f.h5")
            probe_run(cfg, model, Pixels(BATCH)), bare_forward(head, batches[:1])  # warm-up
            ours, base = [], []
            for _ in range(args.repeat):
                ours.append(probe_run(cfg, model, dataset))
                base.append(bare_forward(head, batches))
            ours_s, base_s = statistics.median(t for t, _ in ours), statistics.median(base)
            plan_s = statistics.median(p for _, p in ours)
            ratio = ours_s / base_s
            print(f"forward, {args.images} images: probe {ours_s:6.2f} s "
                  f"({args.images / ours_s:5.1f} img/s, of which the plan {plan_s:.2f} s)  bare "
                  f"up to block 6 {base_s:6.2f} s ({args.images / base_s:5.1f} img/s)  ratio "
                  f"{ratio:4.2f} ({'meets' if ratio <= 1.05 else 'MISSES'} <= 1.05), "
                  f"{(ours_s - plan_s) / base_s:4.2f} without the plan; median of "
                  f"{args.repeat}", flush=True)
        if "memory" in cases:
            one = args.memory_images or args.images
            peaks = {}
            for times in (1, 4):
                images = png_folder(tmp / f"png{times}", one * times)
                peaks[times] = folder_peak_mib(model_dir, images, tmp / f"m{times}.h5")
            print(f"memory: peak RSS {peaks[1]:.0f} MiB at {one} PNG images, {peaks[4]:.0f} MiB "
                  f"at {4 * one} ({peaks[4] / peaks[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
