"""probe under an intervention against the same probe run without it, in one process.

    python benchmarks/bench_intervene.py                     # the issue's case
    python benchmarks/bench_intervene.py --prompts 32 --repeat 3

A GPT-2-small-shaped model with random weights (12 blocks, width 768, 12 heads, GPT-2's
vocabulary), prompts of 16 to 128 tokens, batches of 16; probe stores block 6's output for every
token. Two cases, each run alternately with and without the intervention:

    steer + generate   a vector added to block 3's output at every position, the prompt's and
                       each of 32 new tokens' (greedy, never stopping early, so that both runs
                       compute as many tokens)
    heads + forward    two heads of block 3 zeroed, a forward pass over the prompts

The intervened run's cost is its hooks (a positions pre-hook on the model, one hook on the
module) and the change itself; the target is <= 1.10x. Medians of --repeat; the machine may be
noisy: compare the ratios.
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

import numpy as np
import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.bench_text import corpus  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from tests.tiny_text import tiny_gpt2  # noqa: E402

LAYER = "transformer.h.6"
NEW = 32


def _cfg(model_dir: Path, docs: Path, out: Path, interventions: list | None, *extra: str):
    cfg = compose(["model=transformers", f"model.name={model_dir}", "dataset=text",
                   f"dataset.path={docs}", f"layers=[{LAYER}]", "batch_size=16",
                   f"output.path={out}", "output.overwrite=true", "device=cpu", *extra])
    if interventions:
        cfg.intervene = OmegaConf.create(interventions)
    return cfg


def timed(cfg, model, dataset) -> float:
    started = time.perf_counter()
    path = probe.execute(probe.plan(cfg, model=model, dataset=dataset))
    elapsed = time.perf_counter() - started
    Path(path).unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["steer", "heads"], action="append")
    parser.add_argument("--prompts", type=int, default=64)
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
        docs = corpus(tmp, args.prompts, AutoTokenizer.from_pretrained(model_dir))
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        np.save(tmp / "v.npy", np.random.default_rng(0).normal(size=768).astype(np.float32))
        cases = {
            "steer": ([{"at": "transformer.h.3", "do": "add", "vector": str(tmp / "v.npy"),
                        "alpha": 4.0}],
                      [f"generate.max_new_tokens={NEW}", "generate.stop_at_eos=false"]),
            "heads": ([{"at": "transformer.h.3.attn", "do": "heads", "heads": [0, 5]}], []),
        }
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.prompts} "
              f"prompts of 16-128 tokens, batches of 16; median of {args.repeat}; load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        for name in args.case or list(cases):
            items, extra = cases[name]
            plain = _cfg(model_dir, docs, tmp / "plain.h5", None, *extra)
            changed = _cfg(model_dir, docs, tmp / "changed.h5", items, *extra)
            dataset = build_dataset(plain)
            timed(changed, model, dataset)  # warm-up
            ours, base = [], []
            for _ in range(args.repeat):  # alternately
                base.append(timed(plain, model, dataset))
                ours.append(timed(changed, model, dataset))
            a, b = statistics.median(ours), statistics.median(base)
            verdict = "meets" if a / b <= 1.10 else "MISSES"
            print(f"{name + (' + generate' if extra else ' + forward'):<18} intervened "
                  f"{a:7.2f} s  plain {b:7.2f} s  ratio {a / b:4.2f} ({verdict} <= 1.10)  "
                  f"[runs: {', '.join(f'{x:.2f}' for x in ours)} vs "
                  f"{', '.join(f'{x:.2f}' for x in base)}]", flush=True)


if __name__ == "__main__":
    main()
