"""probe on a vision-language model against the bare model on the same batches, in one process.

    python benchmarks/bench_vlm.py                        # the issue's case (long on 2 cores)
    python benchmarks/bench_vlm.py --images 32 --repeat 3

A LLaVA-shaped model with random weights: a CLIP ViT-B/16-shaped vision tower (12 blocks,
width 768, 224 px: 196 image tokens), LLaVA's 2-layer projector, a Llama of 8 blocks, width
512; images with short prompts through its processor and chat template, batches of 8. probe
stores one vision block (model.vision_tower.encoder.layers.6) and one language-model block
(model.language_model.layers.4), every position, in an HDF5 file. The baselines run the same
model object on the same batches (the same loader: images read, the processor called) and keep
nothing:

    forward      model(**inputs) on each batch, no hooks
    generate     model.generate() on each batch padded on the left, 16 new tokens (greedy)
    memory       peak RSS of a probe run on N and 4N images, each in a fresh process

Medians of --repeat alternating runs; the machine may be noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from tests.tiny_text import documents  # noqa: E402
from tests.tiny_vlm import llava  # noqa: E402

LAYERS = "layers=[model.vision_tower.encoder.layers.6,model.language_model.layers.4]"
NEW = 16
BATCH = 8


def make_model(folder: Path) -> Path:
    torch.manual_seed(0)
    llava(folder, image=224, patch=16, vision=(768, 12, 12), text=(512, 8, 8))
    return folder


def make_pairs(folder: Path, count: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    prompts = documents(count, seed=7, low=4, high=16)
    with (folder / "pairs.jsonl").open("w") as stream:
        for n, prompt in enumerate(prompts):
            size = (224 + 32 * (n % 3), 224 + 16 * (n % 2))
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(
                folder / f"{n}.png")
            stream.write(json.dumps({"image": f"{n}.png", "text": prompt}) + "\n")
    return folder / "pairs.jsonl"


def _cfg(model_dir: Path, pairs: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}", "dataset=pairs",
                    f"dataset.path={pairs}", LAYERS, f"batch_size={BATCH}", f"output.path={out}",
                    "output.overwrite=true", "device=cpu", *extra])


def probe_run(cfg, model, dataset) -> float:
    started = time.perf_counter()
    path = probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    Path(path).unlink()
    return elapsed


def batches(dataset):
    # the batches probe's own loader makes: images read, the processor called
    return dataset.feed.loader(dataset, list(range(len(dataset))), Batching(BATCH))


def bare_forward(model, dataset) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches(dataset):
            model(**batch.inputs)
    return time.perf_counter() - started


def bare_generate(model, dataset) -> float:
    from probe.pipeline.generation import _padded_left

    pad = model.generation_config.pad_token_id
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches(dataset):
            inputs, _ = _padded_left(batch.inputs, batch.layout.keep)
            model.generate(**inputs, max_new_tokens=NEW, do_sample=False, pad_token_id=pad,
                           use_cache=True)
    return time.perf_counter() - started


def peak_mib(model_dir: Path, pairs: Path, out: Path) -> float:
    peak = peak_rss_mib(f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                        "from benchmarks.bench_vlm import _cfg\nimport probe\n"
                        "from pathlib import Path\n"
                        f"probe.run(_cfg(Path({str(model_dir)!r}), Path({str(pairs)!r}), "
                        f"Path({str(out)!r})))")
    out.unlink()
    return peak


def compare(name: str, ours: list[float], bare: list[float], target: float) -> None:
    a, b = statistics.median(ours), statistics.median(bare)
    verdict = "meets" if a / b <= target else "MISSES"
    print(f"{name:<22} probe {a:7.2f} s  bare {b:7.2f} s  ratio {a / b:4.2f} "
          f"({verdict} <= {target:.2f}); load {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["forward", "generate", "memory"], action="append")
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = args.case or ["forward", "generate", "memory"]
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForImageTextToText

    from probe.families.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = make_model(tmp / "llava")
        pairs = make_pairs(tmp / "pairs", args.images)
        model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
        cfg = _cfg(model_dir, pairs, tmp / "f.h5")
        dataset = build_dataset(cfg)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(dataset)} "
              f"images with prompts, batches of {BATCH}; median of {args.repeat}; load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        if "forward" in cases:
            small = _cfg(model_dir, pairs, tmp / "w.h5", "limit=8")
            probe_run(small, model, dataset)  # warm-up
            ours, bare = [], []
            for _ in range(args.repeat):
                ours.append(probe_run(cfg, model, dataset))
                bare.append(bare_forward(model, dataset))
            compare("forward", ours, bare, 1.05)
        if "generate" in cases:
            # greedy, both stopping at the end token: the same tokens on both sides
            generating = _cfg(model_dir, pairs, tmp / "g.h5", f"generate.max_new_tokens={NEW}")
            ours, bare = [], []
            for _ in range(args.repeat):
                ours.append(probe_run(generating, model, dataset))
                bare.append(bare_generate(model, dataset))
            compare(f"generate ({NEW} tokens)", ours, bare, 1.10)
        if "memory" in cases:
            quarter = pairs.with_name("quarter.jsonl")
            quarter.write_text("".join(pairs.read_text().splitlines(True)[:args.images // 4]))
            small = statistics.median(peak_mib(model_dir, quarter, tmp / "m1.h5")
                                      for _ in range(args.repeat))
            large = statistics.median(peak_mib(model_dir, pairs, tmp / "m4.h5")
                                      for _ in range(args.repeat))
            verdict = "meets" if large / small <= 1.10 else "MISSES"
            print(f"{'peak RSS, 4x images':<22} {large:.0f} MiB ({args.images}) vs {small:.0f} "
                  f"MiB ({args.images // 4}): ratio {large / small:4.2f} ({verdict} <= 1.10)")


if __name__ == "__main__":
    main()
