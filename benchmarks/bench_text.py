"""probe on a language model against the bare padded loop, measured in one process.

    python benchmarks/bench_text.py                   # every case (a few minutes on 2 CPU cores)
    python benchmarks/bench_text.py --case forward    # forward, grad, memory

A GPT-2-shaped model with random weights (6 blocks, width 512, GPT-2's vocabulary size), 512
documents of 16 to 128 tokens, batches of 16, the residual stream after block 2 (transformer.h.2)
with every real token stored. probe runs with its length-bucketed batches (the default) and
without them; the baselines run the same model object on right-padded batches in dataset order,
as every peer does, and keep nothing:

    forward  the model only up to that block (a copy whose later blocks are cut off)
    grad     the whole forward, each document's mean next-token loss, and autograd.grad down to
             that block's output only (parameters frozen)
    memory   peak RSS of a streamed probe run on 1x and 8x the documents (each in its own
             process)

Medians of --repeat alternating runs; the machine may be noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
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
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from probe.data.feed import Batching  # noqa: E402
from tests.tiny_text import WORDS, tiny_gpt2, write_jsonl  # noqa: E402

LAYER = "transformer.h.2"


def corpus(directory: Path, count: int, tokenizer, seed: int = 0) -> Path:
    """``count`` documents of 16 to 128 tokens (each length drawn uniformly)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        want, words = rng.randint(16, 128), []
        while len(tokenizer(" ".join(words))["input_ids"]) < want:
            words += [rng.choice(WORDS) for _ in range(8)]
        ids = tokenizer(" ".join(words))["input_ids"][:want]
        texts.append(tokenizer.decode(ids))
    return write_jsonl(directory / f"docs{count}.jsonl", texts)


def _cfg(model_dir: Path, docs: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}",
                    "dataset=text", f"dataset.path={docs}", f"layers=[{LAYER}]",
                    "batch_size=16", f"output.path={out}", "output.overwrite=true",
                    "device=cpu", *extra])


def probe_run(cfg, model, dataset) -> float:
    started = time.perf_counter()
    probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    Path(cfg.output.path).unlink()
    return elapsed


def batches(dataset, feed):
    return list(feed.loader(dataset, list(range(len(dataset))), Batching(16)))


def bare_forward(head, loader) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in loader:
            head.transformer(**batch.inputs)
    return time.perf_counter() - started


def bare_grad(model, loader) -> float:
    """Forward, per-document mean next-token loss, autograd.grad to LAYER's output only."""
    from probe.families.transformers import nll

    blocks = model.transformer.h
    for p in model.parameters():
        p.requires_grad_(False)
    kept = {}
    hook = blocks[2].register_forward_hook(
        lambda m, a, out: kept.update(out=out.requires_grad_()))
    started = time.perf_counter()
    for batch in loader:
        with torch.enable_grad():
            output = model(**batch.inputs)
            torch.autograd.grad(nll(output.logits, batch).sum(), kept["out"])
    elapsed = time.perf_counter() - started
    hook.remove()
    for p in model.parameters():
        p.requires_grad_(True)
    return elapsed


def padded_share(dataset, batching: Batching) -> float:
    """The share of the positions a run's batches compute that are padding."""
    from probe.data.buckets import plan_batches

    lengths = dataset.lengths(list(range(len(dataset))))
    planned = plan_batches(lengths, batching)
    computed = sum(int(lengths[p].max()) * len(p) for p, _ in planned)
    return 1 - int(lengths.sum()) / computed


def report(name: str, ours: float, base_name: str, base: float, target: float, tokens: int):
    ratio = ours / base
    verdict = "meets" if ratio <= target else "MISSES"
    print(f"{name:<28} probe {ours:6.2f} s ({tokens / ours:7.0f} tok/s)  {base_name} "
          f"{base:6.2f} s ({tokens / base:7.0f} tok/s)  ratio {ratio:4.2f} "
          f"({verdict} <= {target:.2f})", flush=True)


def compare(args, model, dataset, tokens: int, name: str, extra: list[str], baseline,
            base_name: str, targets: tuple[float, float]) -> None:
    """probe with and without bucketing against the baseline, alternating, medians."""
    model_dir, docs = Path(model.name_or_path), Path(dataset.source)
    bucketed = _cfg(model_dir, docs, docs.with_name("b.h5"), *extra)
    plain = _cfg(model_dir, docs, docs.with_name("p.h5"), *extra, "bucket_by_length=false")
    ours, unbucketed, base = [], [], []
    for _ in range(args.repeat):
        ours.append(probe_run(bucketed, model, dataset))
        unbucketed.append(probe_run(plain, model, dataset))
        base.append(baseline())
    report(name, statistics.median(ours), base_name, statistics.median(base), targets[0], tokens)
    report("  without bucketing", statistics.median(unbucketed), base_name,
           statistics.median(base), targets[1], tokens)


def streamed_peak_mib(model_dir: Path, docs: Path, out: Path) -> float:
    peak = peak_rss_mib(f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                        "from benchmarks.bench_text import _cfg\nimport probe\n"
                        "from pathlib import Path\n"
                        f"probe.run(_cfg(Path({str(model_dir)!r}), Path({str(docs)!r}), "
                        f"Path({str(out)!r}), 'dataset.streaming=true'))")
    out.unlink()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["forward", "grad", "memory"], action="append")
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probe.families.build import build_dataset

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tiny_gpt2(tmp / "gpt2", layers=6, width=512, heads=8, positions=1024,
                              vocab=50257)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        docs = corpus(tmp, args.docs, tokenizer)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        model.config.use_cache = False
        cfg = _cfg(model_dir, docs, tmp / "f.h5")
        dataset = build_dataset(cfg)
        loader = batches(dataset, dataset.feed)
        tokens = sum(int(b.layout.keep.sum()) for b in loader)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(dataset)} "
              f"documents, {tokens} tokens; padding is {padded_share(dataset, Batching(16)):.0%} "
              f"of the positions in batches of 16 in dataset order, "
              f"{padded_share(dataset, Batching(16, bucket=True)):.0%} with bucketing; median "
              f"of {args.repeat}")
        if "forward" in (args.case or ["forward"]):
            head = copy.deepcopy(model)
            head.transformer.h = head.transformer.h[:3]  # the model up to transformer.h.2
            probe_run(cfg, model, dataset), bare_forward(head, loader)  # warm-up, not timed
            compare(args, model, dataset, tokens, "forward, every token", [],
                    lambda: bare_forward(head, loader), "bare up to h.2", (0.75, 1.05))
        if "grad" in (args.case or ["grad"]):
            compare(args, model, dataset, tokens, "nll gradients at h.2",
                    ["hooks=[backward]", "objective=nll"], lambda: bare_grad(model, loader),
                    "bare fwd+grad", (0.80, 1.10))
        if "memory" in (args.case or ["memory"]):
            more = corpus(tmp, args.docs * 8, tokenizer, seed=1)
            one = statistics.median(streamed_peak_mib(model_dir, docs, tmp / "m1.h5")
                                    for _ in range(args.repeat))
            eight = statistics.median(streamed_peak_mib(model_dir, more, tmp / "m8.h5")
                                      for _ in range(args.repeat))
            verdict = "meets" if eight / one <= 1.10 else "MISSES"
            print(f"{'peak RSS, 8x the documents':<28} {eight:.0f} MiB vs {one:.0f} MiB: ratio "
                  f"{eight / one:4.2f} ({verdict} <= 1.10)")


if __name__ == "__main__":
    main()
