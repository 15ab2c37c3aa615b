"""probe on a speech encoder against the bare padded loop, measured in one process.

    python benchmarks/bench_audio.py                      # 64 clips of 1-10 s (minutes on 2 cores)
    python benchmarks/bench_audio.py --clips 16 --longest 4 --repeat 1   # a quick look

A wav2vec2-base-shaped model with random weights (width 768, 12 blocks, the 7-conv stem that
gives 50 frames a second at 16 kHz; the layer-norm variant, whose extractor gives an attention
mask, so clips of different lengths share batches), clips of 1 to ``--longest`` s (lengths
drawn uniformly), batches of 8, block 5's output (encoder.layers.5) with every real frame
stored. probe decodes the wav files, runs the feature extractor and the model, and writes the
file; the baseline runs the same model object, cut after block 5, on the same batches made
beforehand in dataset order, and keeps nothing. Medians of --repeat alternating runs; the
machine may be noisy: compare the ratios.
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

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from tests.tiny_audio import tone, write_wav  # noqa: E402

BLOCK = 5
LAYER = f"encoder.layers.{BLOCK}"


def base_shaped(directory: Path) -> Path:
    """wav2vec2-base's shape, random weights, and its feature extractor (with a mask)."""
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    config = Wav2Vec2Config(feat_extract_norm="layer", do_stable_layer_norm=True,
                            mask_time_prob=0.0)
    torch.manual_seed(0)
    Wav2Vec2Model(config).save_pretrained(directory)
    Wav2Vec2FeatureExtractor(return_attention_mask=True).save_pretrained(directory)
    return directory


def clips(directory: Path, count: int, longest: float, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for n, seconds in enumerate(rng.uniform(1, longest, count)):
        write_wav(directory / "x" / f"{n:03d}.wav", tone(float(seconds), seed=n))
    return directory


def _cfg(model_dir: Path, root: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}",
                    "model.head=base", "dataset=audio", f"dataset.root={root}",
                    f"layers=[{LAYER}]", "batch_size=8", f"output.path={out}",
                    "output.overwrite=true", "device=cpu", *extra])


def probe_run(cfg, model, dataset) -> float:
    started = time.perf_counter()
    probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    Path(cfg.output.path).unlink()
    return elapsed


def bare_forward(head, loader) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in loader:
            head(**batch.inputs)
    return time.perf_counter() - started


def padded_share(dataset, batching: Batching) -> float:
    """The share of the input samples a run's batches compute that are padding."""
    from probe.data.buckets import plan_batches

    lengths = dataset.lengths(list(range(len(dataset))))
    planned = plan_batches(lengths, batching)
    computed = sum(int(lengths[p].max()) * len(p) for p, _ in planned)
    return 1 - int(lengths.sum()) / computed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=64)
    parser.add_argument("--longest", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModel

    from probe.families import family_for
    from probe.families.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = base_shaped(tmp / "wav2vec2")
        root = clips(tmp / "clips", args.clips, args.longest)
        model = AutoModel.from_pretrained(model_dir).eval()
        cfg = _cfg(model_dir, root, tmp / "b.h5")
        plain = _cfg(model_dir, root, tmp / "p.h5", "bucket_by_length=false")
        dataset = build_dataset(cfg)
        # the feed that knows the model's frames, as the plan makes it
        feed = dataset.feed.for_model(family_for(cfg.model, model).output_lengths(model))
        every = list(range(len(dataset)))
        loader = list(feed.loader(dataset, every, Batching(8)))
        frames = sum(int(b.layout.keep.sum()) for b in loader)
        seconds = sum(len(dataset[i]["audio"]) for i in every) / dataset.sampling_rate
        head = copy.deepcopy(model)
        head.encoder.layers = head.encoder.layers[:BLOCK + 1]  # the model up to LAYER
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(dataset)} "
              f"clips of 1-{args.longest:g} s, {seconds:.0f} s of sound, {frames} frames; "
              f"padding is {padded_share(dataset, Batching(8)):.0%} of the samples in batches "
              f"of 8 in dataset order, {padded_share(dataset, Batching(8, bucket=True)):.0%} "
              f"with bucketing; median of {args.repeat}", flush=True)
        probe_run(cfg, model, dataset), bare_forward(head, loader)  # warm-up, not timed
        ours, unbucketed, base = [], [], []
        for _ in range(args.repeat):
            ours.append(probe_run(cfg, model, dataset))
            unbucketed.append(probe_run(plain, model, dataset))
            base.append(bare_forward(head, loader))
        bare = statistics.median(base)
        for name, times in (("probe, bucketed", ours), ("probe, dataset order", unbucketed)):
            took = statistics.median(times)
            print(f"{name:<22} {took:6.2f} s ({frames / took:6.0f} frames/s)  bare up to "
                  f"{LAYER} in dataset order {bare:6.2f} s ({frames / bare:6.0f} frames/s)  "
                  f"ratio {took / bare:4.2f}", flush=True)


if __name__ == "__main__":
    main()
