"""Attention patterns (hooks=[attention]) against the same run storing the block's output, in one
process, and against TransformerLens' run_with_cache where it can be imported.

    python benchmarks/bench_attention.py                  # the issue's case: 512 documents
    python benchmarks/bench_attention.py --docs 128 --repeat 3
    PYTHONPATH=/tmp/tl python benchmarks/bench_attention.py   # with TransformerLens there

A GPT-2-small-shaped model with random weights (12 blocks, width 768, 12 heads, GPT-2's
vocabulary), documents of 16 to 128 tokens (dataset.max_length=128), batches of 16, bucketed:

    pattern   probe storing block 6's attention pattern (transformer.h.6.attn/attention: a row
              of (12 heads, 128 keys) per token); that module alone runs eager, the other
              blocks keep sdpa
    output    probe storing the same module's output (transformer.h.6.attn, hooks=[forward]):
              the same run otherwise, every block on sdpa
    lens      TransformerLens' HookedTransformer of the same shape (its own random weights),
              run_with_cache of blocks.6.attn.hook_pattern on the same padded batches, stopped
              after block 6, keeping nothing: every block runs its eager attention

Medians of --repeat alternating runs; the machine may be noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.bench_text import corpus  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from tests.tiny_text import tiny_gpt2  # noqa: E402


def _cfg(model_dir: Path, docs: Path, out: Path, layer: str, hook: str):
    return compose(["model=transformers", f"model.name={model_dir}", "dataset=text",
                    f"dataset.path={docs}", "dataset.max_length=128", f"layers=[{layer}]",
                    f"hooks=[{hook}]", "batch_size=16", f"output.path={out}",
                    "output.overwrite=true", "device=cpu"])


def probe_run(cfg, model, dataset) -> tuple[float, int]:
    """Seconds, and the bytes of the file."""
    started = time.perf_counter()
    path = probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    size = Path(path).stat().st_size
    Path(path).unlink()
    return elapsed, size


def lens_model():
    """TransformerLens' GPT-2 small shape with random weights, or None where it is missing."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        return None
    config = HookedTransformerConfig(n_layers=12, d_model=768, d_head=64, n_heads=12,
                                     d_mlp=3072, d_vocab=50257, n_ctx=1024, act_fn="gelu_new",
                                     normalization_type="LN", device="cpu", seed=0)
    return HookedTransformer(config).eval()


def lens_run(model, batches) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model.run_with_cache(batch.inputs["input_ids"],
                                 attention_mask=batch.inputs["attention_mask"],
                                 names_filter="blocks.6.attn.hook_pattern", stop_at_layer=7)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probe.families.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tiny_gpt2(tmp / "gpt2", layers=12, width=768, heads=12, positions=1024,
                              vocab=50257)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        docs = corpus(tmp, args.docs, tokenizer)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        pattern = _cfg(model_dir, docs, tmp / "p.h5", "transformer.h.6.attn", "attention")
        output = _cfg(model_dir, docs, tmp / "o.h5", "transformer.h.6.attn", "forward")
        dataset = build_dataset(pattern)
        selection = list(range(len(dataset)))
        tokens = int(dataset.lengths(selection).sum())
        batches = list(dataset.feed.loader(dataset, selection, Batching(16, bucket=True)))
        lens = lens_model()
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(dataset)} "
              f"documents, {tokens} tokens, batches of 16; TransformerLens "
              f"{'imported' if lens is not None else 'not importable: left out'}; median of "
              f"{args.repeat}; load {os.getloadavg()[0]:.2f}", flush=True)
        probe_run(output, model, dataset)  # warm-up, not timed
        times: dict[str, list[float]] = {"pattern": [], "output": [], "lens": []}
        sizes = {}
        for _ in range(args.repeat):
            for name, cfg in (("pattern", pattern), ("output", output)):
                took, sizes[name] = probe_run(cfg, model, dataset)
                times[name].append(took)
            if lens is not None:
                times["lens"].append(lens_run(lens, batches))
        base = statistics.median(times["output"])
        for name, said in (("pattern", "probe, block 6's pattern"),
                           ("output", "probe, that module's output"),
                           ("lens", "TransformerLens run_with_cache")):
            if not times[name]:
                continue
            took = statistics.median(times[name])
            size = f", {sizes[name] / 2**20:7.1f} MiB file" if name in sizes else ""
            target = " (target <= 1.15)" if name == "pattern" else ""
            print(f"{said:<32} {took:7.2f} s ({tokens / took:6.0f} tok/s{size})  / output "
                  f"{took / base:4.2f}{target}", flush=True)


if __name__ == "__main__":
    main()
