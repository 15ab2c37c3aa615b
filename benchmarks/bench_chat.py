"""probe's conversation capture (dataset=chat) against a bare loop, and its speculators export
against a raw copy, in one process; peak memory in fresh ones.

    python benchmarks/bench_chat.py                                  # the issue's case
    python benchmarks/bench_chat.py --conversations 16 --repeat 1    # a quick smoke run
    python benchmarks/bench_chat.py --smoke                          # the same

A Llama-shaped model with random weights (8 blocks, width 512, MLP 1376, 8 heads of which 4 key
and value heads), its vocabulary a byte-level BPE trained here on the fly with ``tokenizers``,
given ChatML's special tokens and a ChatML chat template (no generation marks: probe finds the
assistant's tokens by rendering each prefix); both saved with save_pretrained in one folder.
``--conversations`` seeded multi-turn conversations (a system turn half of the time, then user
and assistant turns) of 64 to 1024 rendered tokens, batches of 8. Three cases:

    capture   probe stores the outputs of model.layers.1, 3, 5 and 7 for every token
              (dataset=chat, tokens=all, dataset.max_length=1024, bucket_by_length=false, so
              that its batches are the bare loop's) against a bare loop over the same
              conversations in the same batches of 8 (dataset order, right-padded): each
              rendered with tokenizer.apply_chat_template(messages, tokenize=True), padded, and
              model(input_ids, attention_mask) under torch.inference_mode with no hooks. Both
              use the same loaded model; probe's run builds its dataset anew each time (its
              renders are timed, as the loop's are). Target: <= 1.10x; tokens/s of each.
    export    export(file, "speculators", aux=[2, 4, 6]) of the capture's file (ids 2, 4, 6 and
              8: the outputs of blocks 1, 3, 5 and 7) against a raw copy of the same bytes:
              h5py reads the four keys, /input_ids and /loss_mask in blocks and numpy's tofile
              writes them to one file, fsynced (as the export fsyncs its folder). Throughput
              ratio = raw seconds / export seconds. Target: >= 0.8.
    memory    the peak resident memory (VmHWM) of a fresh process that runs the capture on N
              and on 2N conversations (N = --memory-conversations, default --conversations):
              flat in the number of conversations. VmHWM, not getrusage's ru_maxrss: on Linux
              ru_maxrss carries over from the parent through fork and exec
              (benchmarks/peak.py).

Medians of --repeat runs, the two sides alternating, after a warm-up of each. The machine may
be noisy: compare the ratios, and the load average printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import probe  # noqa: E402
from benchmarks.peak import peak_rss_mib  # noqa: E402
from probe.config.compose import compose  # noqa: E402
from tests.tiny_text import WORDS, documents  # noqa: E402

LAYERS = ["model.layers.1", "model.layers.3", "model.layers.5", "model.layers.7"]
AUX = [2, 4, 6]  # + 8: the outputs of blocks 1, 3, 5 (and 7, the last)
DEPTH, WIDTH, BATCH, LONGEST, SHORTEST = 8, 512, 8, 1024, 64
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
          "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


def chat_llama(directory: Path, seed: int = 0) -> Path:
    """The Llama-shaped model and its ChatML tokenizer, saved in ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(documents(200, seed=99), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                        bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    tokenizer.chat_template = CHATML
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=WIDTH, intermediate_size=1376,
                         num_hidden_layers=DEPTH, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=LONGEST,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _ids(found) -> list[int]:
    # apply_chat_template(tokenize=True): a BatchEncoding (transformers 5) or a list of ids
    return list(found["input_ids"] if isinstance(found, Mapping) else found)


def conversations(count: int, tokenizer, seed: int = 0) -> list[list[dict]]:
    """``count`` conversations, each of a length drawn uniformly from 64 to 1024 rendered
    tokens: a system turn half of the time, then user and assistant turns of 4 to 80 words
    until the length is reached, the last answer (then its question) cut to it."""
    rng = random.Random(seed)

    def said(low: int, high: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))

    def length(messages: list[dict]) -> int:
        return len(_ids(tokenizer.apply_chat_template(messages, tokenize=True)))

    chats = []
    for _ in range(count):
        want = rng.randint(SHORTEST, LONGEST)
        messages = [{"role": "system", "content": said(4, 24)}] if rng.random() < 0.5 else []
        while True:
            messages += [{"role": "user", "content": said(4, 80)},
                         {"role": "assistant", "content": said(4, 80)}]
            if length(messages) >= want:
                break
        for message in (messages[-1], messages[-2]):  # the last answer, then its question
            while (over := length(messages) - want) > 0:  # about a token a word
                words = message["content"].split()
                if len(words) == 1:
                    break
                message["content"] = " ".join(words[:max(1, len(words) - over)])
        if length(messages) > LONGEST and len(messages) > 3:  # headers alone went over
            messages = messages[:-2]
        chats.append(messages)
    return chats


def write_chats(path: Path, chats: list[list[dict]]) -> Path:
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in chats))
    return path


def _overrides(model_dir: Path, chats: Path, out: Path) -> list[str]:
    return ["model=transformers", f"model.name={model_dir}", "dataset=chat",
            f"dataset.path={chats}", f"dataset.max_length={LONGEST}",
            f"layers=[{','.join(LAYERS)}]", "tokens=all", f"batch_size={BATCH}",
            "bucket_by_length=false", f"output.path={out}", "output.overwrite=true",
            "device=cpu"]


def probe_run(cfg, model) -> tuple[float, Path]:
    """Seconds of one capture (its dataset built anew: the renders are timed), and its file."""
    started = time.perf_counter()
    path = Path(probe.execute(probe.plan(cfg, model=model)))
    return time.perf_counter() - started, path


def bare_run(model, tokenizer, chats: list[list[dict]]) -> tuple[float, int]:
    """Seconds and real tokens of the loop without probe: render, tokenize, right-pad and run
    each batch of 8 in dataset order, no hooks, nothing kept."""
    pad = tokenizer.pad_token_id
    tokens = 0
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(chats), BATCH):
            rows = [_ids(tokenizer.apply_chat_template(m, tokenize=True))[:LONGEST]
                    for m in chats[start:start + BATCH]]
            longest = max(map(len, rows))
            ids = torch.full((len(rows), longest), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), longest), dtype=torch.long)
            for n, row in enumerate(rows):
                ids[n, :len(row)] = torch.as_tensor(row)
                mask[n, :len(row)] = 1
            model(input_ids=ids, attention_mask=mask)
            tokens += sum(map(len, rows))
    return time.perf_counter() - started, tokens


def export_run(path: Path, out: Path) -> tuple[float, int]:
    """Seconds of export(to=speculators), and the bytes it wrote; the folder is removed."""
    from probe.file.exports import export

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    done = export(path, "speculators", out_dir=out, aux=AUX)
    elapsed = time.perf_counter() - started
    wrote = done.bytes
    shutil.rmtree(out)
    return elapsed, wrote


def raw_run(path: Path, out: Path, budget: int = 64 * 2**20) -> tuple[float, int]:
    """Seconds of copying the keys the export reads (the four layers' rows, /input_ids,
    /loss_mask) as they are, into one file, in blocks of ``budget`` bytes; and the bytes."""
    keys = [f"{layer}/output" for layer in LAYERS] + ["input_ids", "loss_mask"]
    written = 0
    started = time.perf_counter()
    with h5py.File(path, "r") as file, out.open("wb") as stream:
        for key in keys:
            dataset = file[key]
            step = max(1, budget // (dataset.dtype.itemsize * int(np.prod(dataset.shape[1:]))))
            for a in range(0, len(dataset), step):
                block = dataset[a:a + step]
                block.tofile(stream)
                written += block.nbytes
        stream.flush()
        os.fsync(stream.fileno())
    elapsed = time.perf_counter() - started
    out.unlink()
    return elapsed, written


_PEAK_RUN = """import sys; sys.path.insert(0, {repo!r})
import probe
from probe.config.compose import compose
probe.run(compose({overrides!r}))
"""


def peak_of(model_dir: Path, chats: Path, out: Path) -> float:
    """MiB of peak resident memory of a fresh process that runs the capture; the file is
    removed."""
    overrides = _overrides(model_dir, chats, out)
    try:
        return peak_rss_mib(_PEAK_RUN.format(repo=str(REPO), overrides=overrides))
    finally:
        out.unlink(missing_ok=True)


def _runs(values: list[float]) -> str:
    return f"[{', '.join(f'{x:.2f}' for x in values)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-conversations", type=int, default=None,
                        help="N of the memory case (N and 2N; default --conversations)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="leave out the memory case (two more captures, of N and 2N)")
    parser.add_argument("--smoke", action="store_true",
                        help="a quick run: --conversations 16 --repeat 1")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    args = parser.parse_args()
    if args.smoke:
        args.conversations, args.repeat = 16, 1
    few = args.memory_conversations or args.conversations
    import logging

    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmp = Path(tmp)
        model_dir = chat_llama(tmp / "llama")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        chats = conversations(max(args.conversations, 2 * few if args.memory else 0),
                              tokenizer)
        data = write_chats(tmp / "chats.jsonl", chats[:args.conversations])
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        lengths = [len(_ids(tokenizer.apply_chat_template(m, tokenize=True)))
                   for m in chats[:args.conversations]]
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Llama-shaped, "
              f"{DEPTH} blocks of width {WIDTH}, vocabulary {len(tokenizer)}; "
              f"{args.conversations} conversations of {min(lengths)}-{max(lengths)} tokens "
              f"({sum(lengths):,d} in all), batches of {BATCH}, {', '.join(LAYERS)} "
              f"(tokens=all); median of {args.repeat}; load {os.getloadavg()[0]:.2f}",
              flush=True)

        # 1. the capture against the bare loop
        cfg = compose(_overrides(model_dir, data, tmp / "chat.h5"))
        _, path = probe_run(cfg, model)  # warm-ups
        bare_run(model, tokenizer, chats[:args.conversations])
        ours, base = [], []
        for _ in range(args.repeat):  # alternately
            elapsed, tokens = bare_run(model, tokenizer, chats[:args.conversations])
            base.append(elapsed)
            elapsed, path = probe_run(cfg, model)
            ours.append(elapsed)
        with h5py.File(path, "r") as file:
            stored = int(file["offsets"][-1])
        if stored != tokens:
            print(f"(probe stored {stored:,d} token rows, the bare loop ran {tokens:,d} tokens)")
        capture = statistics.median(ours) / statistics.median(base)

        # 2. the export against a raw copy of the same bytes (the last capture's file)
        _, wrote = export_run(path, tmp / "spec")  # warm-ups (and the page cache)
        raw_run(path, tmp / "raw.bin")
        exported, copied = [], []
        for _ in range(args.repeat):  # alternately
            elapsed, copy_bytes = raw_run(path, tmp / "raw.bin")
            copied.append(elapsed)
            elapsed, wrote = export_run(path, tmp / "spec")
            exported.append(elapsed)
        export_ratio = statistics.median(copied) / statistics.median(exported)
        file_bytes = path.stat().st_size
        path.unlink()

        # 3. peak memory of the capture in a fresh process, on N and 2N conversations
        peaks: dict[int, float] = {}
        if args.memory:
            for count in (few, 2 * few):
                peaks[count] = peak_of(model_dir, write_chats(tmp / f"chats{count}.jsonl",
                                                              chats[:count]),
                                       tmp / f"peak{count}.h5")

        mib = 2**20
        t_probe, t_bare = statistics.median(ours), statistics.median(base)
        t_export, t_raw = statistics.median(exported), statistics.median(copied)
        print(f"\n{'case':<26} {'seconds':>8} {'ratio':>6} {'throughput':>16}  runs")
        print(f"{'capture: probe':<26} {t_probe:8.2f} {capture:6.3f} "
              f"{stored / t_probe:10,.0f} tok/s  {_runs(ours)}")
        print(f"{'capture: bare loop':<26} {t_bare:8.2f} {1:6.3f} "
              f"{tokens / t_bare:10,.0f} tok/s  {_runs(base)}")
        print(f"{'export: to=speculators':<26} {t_export:8.2f} {export_ratio:6.3f} "
              f"{copy_bytes / t_export / mib:10,.0f} MiB/s  {_runs(exported)}")
        print(f"{'export: h5py + tofile':<26} {t_raw:8.2f} {1:6.3f} "
              f"{copy_bytes / t_raw / mib:10,.0f} MiB/s  {_runs(copied)}")
        print(f"(the probe file {file_bytes / mib:,.0f} MiB; the keys copied "
              f"{copy_bytes / mib:,.0f} MiB; the speculators folder {wrote / mib:,.0f} MiB, "
              f"bfloat16; throughput: the keys' MiB per second)")
        for count, peak in peaks.items():
            print(f"{f'memory: {count} conversations':<26} peak {peak:8.0f} MiB (VmHWM)")

        checks = [("capture time vs bare loop", capture, "<=", 1.10),
                  ("export throughput vs raw copy", export_ratio, ">=", 0.8)]
        if peaks:
            grown = peaks[2 * few] / peaks[few]
            checks.append((f"peak memory {2 * few} vs {few} conversations", grown, "<=", 1.10))
        print("\ntargets (issue 47):")
        for label, ratio, sign, target in checks:
            met = ratio <= target if sign == "<=" else ratio >= target
            print(f"  {label:<38} {ratio:6.3f}  {'meets' if met else 'MISSES'} {sign} "
                  f"{target:.2f}")
        print(f"load {os.getloadavg()[0]:.2f} at the end", flush=True)


if __name__ == "__main__":
    main()
