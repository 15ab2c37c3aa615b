"""probe generating with a language model against the bare ``model.generate()``, in one process.

    python benchmarks/bench_generate.py                      # the issue's case (long on 2 cores)
    python benchmarks/bench_generate.py --prompts 64 --repeat 3

A GPT-2-small-shaped model with random weights (12 blocks, width 768, 12 heads, GPT-2's
vocabulary), prompts of 16 to 128 tokens, 32 new tokens each (greedy), batches of 16. probe
stores the output of block 6 (transformer.h.6) for every token, prompt and answer, in an HDF5
file. The baselines run the same model object and keep nothing:

    batched      model.generate() on the same batches as probe's (bucketed by length, padded
                 on the left), no hooks
    one by one   model.generate() on each prompt alone (no padding), on the first
                 --one-by-one prompts; compared in tokens per second
    memory       peak RSS of a probe run on N and 4N prompts, each in a fresh process

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
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from tests.tiny_text import tiny_gpt2  # noqa: E402

LAYER = "transformer.h.6"
NEW = 32


def _cfg(model_dir: Path, docs: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}", "dataset=text",
                    f"dataset.path={docs}", f"layers=[{LAYER}]", "batch_size=16",
                    f"generate.max_new_tokens={NEW}", f"output.path={out}",
                    "output.overwrite=true", "device=cpu", *extra])


def probe_run(cfg, model, dataset) -> tuple[float, int]:
    """Seconds, and the token rows written (prompts' and answers')."""
    started = time.perf_counter()
    path = probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    with probe.open(path) as f:
        rows = int(f.offsets[-1])
    Path(path).unlink()
    return elapsed, rows


def left_padded(batches) -> list[dict]:
    """probe's batches (bucketed, right-padded) as generate() wants them: padded on the left."""
    from probe.pipeline.generation import _padded_left

    made = []
    for batch in batches:
        inputs, _ = _padded_left(batch.inputs, batch.layout.keep)
        made.append({"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]})
    return made


def bare_generate(model, inputs: list[dict]) -> float:
    pad = model.generation_config.eos_token_id
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in inputs:
            model.generate(**batch, max_new_tokens=NEW, do_sample=False, pad_token_id=pad,
                           use_cache=True)
    return time.perf_counter() - started


def one_by_one(model, dataset, count: int) -> tuple[float, int]:
    """Seconds and tokens (prompt + answer) of generate() on each of the first prompts alone."""
    pad = model.generation_config.eos_token_id
    tokens, started = 0, time.perf_counter()
    with torch.inference_mode():
        for index in range(count):
            ids = dataset[index]["input_ids"][None]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                 do_sample=False, pad_token_id=pad, use_cache=True)
            tokens += out.shape[1]
    return time.perf_counter() - started, tokens


def peak_mib(model_dir: Path, docs: Path, out: Path) -> float:
    peak = peak_rss_mib(f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                        "from benchmarks.bench_generate import _cfg\nimport probe\n"
                        "from pathlib import Path\n"
                        f"probe.run(_cfg(Path({str(model_dir)!r}), Path({str(docs)!r}), "
                        f"Path({str(out)!r})))")
    out.unlink()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["batched", "one-by-one", "memory"], action="append")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--one-by-one", type=int, default=32, dest="alone")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = args.case or ["batched", "one-by-one", "memory"]
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probe.families.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tiny_gpt2(tmp / "gpt2", layers=12, width=768, heads=12, positions=1024,
                              vocab=50257)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        docs = corpus(tmp, args.prompts, tokenizer)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        cfg = _cfg(model_dir, docs, tmp / "f.h5")
        dataset = build_dataset(cfg)
        selection = list(range(len(dataset)))
        inputs = left_padded(dataset.feed.loader(dataset, selection,
                                                 Batching(16, bucket=True)))
        prompt_tokens = int(dataset.lengths(selection).sum())
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(dataset)} "
              f"prompts, {prompt_tokens} prompt tokens, {NEW} new tokens each, batches of 16; "
              f"median of {args.repeat}; load {os.getloadavg()[0]:.2f}", flush=True)
        seconds, rows = [], 0
        if "batched" in cases:
            probe_run(cfg, model, dataset), bare_generate(model, inputs[:2])  # warm-up
            bare = []
            for _ in range(args.repeat):
                took, rows = probe_run(cfg, model, dataset)
                seconds.append(took)
                bare.append(bare_generate(model, inputs))
            ours, base = statistics.median(seconds), statistics.median(bare)
            verdict = "meets" if ours / base <= 1.10 else "MISSES"
            print(f"{'batched generate()':<22} probe {ours:7.2f} s ({rows / ours:6.0f} tok/s, "
                  f"{rows} rows stored)  bare {base:7.2f} s ({rows / base:6.0f} tok/s)  ratio "
                  f"{ours / base:4.2f} ({verdict} <= 1.10)", flush=True)
        if "one-by-one" in cases:
            alone, tokens = one_by_one(model, dataset, args.alone)
            ours = statistics.median(seconds) if seconds else probe_run(cfg, model, dataset)[0]
            rows = rows or probe_run(cfg, model, dataset)[1]
            print(f"{'one prompt at a time':<22} bare {alone:7.2f} s for {args.alone} prompts "
                  f"({tokens / alone:6.0f} tok/s); probe batched {rows / ours:6.0f} tok/s: "
                  f"{(rows / ours) / (tokens / alone):4.2f}x ahead", flush=True)
        if "memory" in cases:
            quarter = docs.with_name("quarter.jsonl")
            quarter.write_text("".join(docs.read_text().splitlines(True)[:args.prompts // 4]))
            small = statistics.median(peak_mib(model_dir, quarter, tmp / "m1.h5")
                                      for _ in range(args.repeat))
            large = statistics.median(peak_mib(model_dir, docs, tmp / "m4.h5")
                                      for _ in range(args.repeat))
            verdict = "meets" if large / small <= 1.10 else "MISSES"
            print(f"{'peak RSS, 4x prompts':<22} {large:.0f} MiB ({args.prompts}) vs {small:.0f} "
                  f"MiB ({args.prompts // 4}): ratio {large / small:4.2f} ({verdict} <= 1.10)")


if __name__ == "__main__":
    main()
