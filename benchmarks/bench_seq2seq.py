"""probe on an encoder-decoder's decoder, teacher-forced and generating, against the bare loop,
measured in one process.

    python benchmarks/bench_seq2seq.py                 # both cases (a few minutes on 2 CPU cores)
    python benchmarks/bench_seq2seq.py --case forced   # forced, generate

A T5-shaped model with random weights (6 + 6 blocks, width 512, 8 heads), 256 pairs of a text
of 16 to 96 words and a target of 8 to 64, batches of 16, the rows of encoder block 2 and of
decoder block 2, a row per real token of each (probe's default length-bucketed batches). The
baselines run the same model object on right-padded batches in dataset order, as every peer
does, and keep nothing:

    forced    the encoder, then the decoder up to block 2 (a copy whose later blocks are cut
              off: probe stops there too) on the target shifted right behind the start token
    generate  transformers' generate() of 16 greedy tokens per text (no end token), the model's
              own; probe stores both blocks' rows of every step

Medians of --repeat alternating runs; the machine may be noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
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

from benchmarks.bench_text import probe_run  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from tests.tiny_archs import word_tokenizer  # noqa: E402
from tests.tiny_text import WORDS  # noqa: E402

LAYERS = "encoder.blocks.2,decoder.blocks.2"
NEW = 16


def checkpoint(folder: Path) -> Path:
    import transformers

    tokenizer = word_tokenizer("encoder-decoder")
    config = transformers.T5Config(vocab_size=len(tokenizer), d_model=512, d_kv=64, d_ff=2048,
                                   num_layers=6, num_heads=8, pad_token_id=0,
                                   eos_token_id=tokenizer.eos_token_id,
                                   decoder_start_token_id=0)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pairs(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as stream:
        for _ in range(count):
            text = " ".join(rng.choices(WORDS, k=rng.randint(16, 96)))
            target = " ".join(rng.choices(WORDS, k=rng.randint(8, 64)))
            stream.write(json.dumps({"text": text, "target": target}) + "\n")
    return path


def _cfg(model_dir: Path, data: Path, out: Path, *extra: str):
    return compose(["model=transformers", f"model.name={model_dir}", "dataset=text",
                    f"dataset.path={data}", f"layers=[{LAYERS}]", "batch_size=16",
                    f"output.path={out}", "output.overwrite=true", "device=cpu", *extra])


def padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(row) for row in rows)
    ids = torch.tensor([row + [pad] * (longest - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (longest - len(row)) for row in rows])
    return ids, mask


def bare_batches(tokenizer, data: Path, targets: bool) -> list[dict]:
    records = [json.loads(line) for line in data.read_text().splitlines()]
    batches = []
    for start in range(0, len(records), 16):
        chunk = records[start:start + 16]
        ids, mask = padded([tokenizer(r["text"])["input_ids"] for r in chunk], 0)
        batch = {"input_ids": ids, "attention_mask": mask}
        if targets:
            labels, target_mask = padded([tokenizer(text_target=r["target"])["input_ids"]
                                          for r in chunk], 0)
            # the target shifted right behind the start token (0), as T5 shifts it
            batch["decoder_input_ids"] = torch.cat([torch.zeros_like(labels[:, :1]),
                                                    labels[:, :-1]], 1)
            batch["decoder_attention_mask"] = target_mask
        batches.append(batch)
    return batches


def bare_forced(cut, batches) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            encoded = cut.encoder(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"]).last_hidden_state
            cut.decoder(input_ids=batch["decoder_input_ids"],
                        attention_mask=batch["decoder_attention_mask"],
                        encoder_hidden_states=encoded,
                        encoder_attention_mask=batch["attention_mask"])
    return time.perf_counter() - started


def bare_generate(model, batches) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            model.generate(**batch, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return time.perf_counter() - started


def report(name: str, ours: float, base_name: str, base: float) -> None:
    print(f"{name:<10} probe {ours:6.2f} s  {base_name} {base:6.2f} s  ratio {ours / base:4.2f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["forced", "generate"], action="append")
    parser.add_argument("--pairs", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases = args.case or ["forced", "generate"]
    import logging

    import transformers

    from probe.families.build import build_dataset

    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = checkpoint(root / "t5")
        data = pairs(root / "pairs.jsonl", args.pairs)
        model = transformers.T5ForConditionalGeneration.from_pretrained(model_dir).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        print(f"{args.pairs} pairs, T5 6+6 blocks x 512, batches of 16, layers {LAYERS}; "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
        if "forced" in cases:
            cfg = _cfg(model_dir, data, root / "f.h5", "dataset.target_column=target")
            dataset = build_dataset(cfg)  # tokenized once, as the bare loop's batches are
            cut = copy.deepcopy(model)
            cut.decoder.block = cut.decoder.block[:3]  # the decoder up to decoder.blocks.2
            batches = bare_batches(tokenizer, data, targets=True)
            probe_run(cfg, model, dataset), bare_forced(cut, batches)  # warm-up, not timed
            ours, base = [], []
            for _ in range(args.repeat):
                ours.append(probe_run(cfg, model, dataset))
                base.append(bare_forced(cut, batches))
            report("forced", statistics.median(ours), "bare", statistics.median(base))
        if "generate" in cases:
            cfg = _cfg(model_dir, data, root / "g.h5", f"generate.max_new_tokens={NEW}",
                       "generate.stop_at_eos=false")
            dataset = build_dataset(cfg)
            batches = bare_batches(tokenizer, data, targets=False)
            ours, base = [], []
            for _ in range(args.repeat):
                ours.append(probe_run(cfg, model, dataset))
                base.append(bare_generate(model, batches))
            report("generate", statistics.median(ours), "generate()", statistics.median(base))


if __name__ == "__main__":
    main()
