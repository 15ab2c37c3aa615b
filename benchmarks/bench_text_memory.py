"""Peak memory of a text capture: probe against the bare loop that stores nothing, and against
another checkout of probe, each run in a fresh process, alternating.

    python benchmarks/bench_text_memory.py                        # this checkout, and the bare loop
    python benchmarks/bench_text_memory.py --other /tmp/v020      # and another checkout (0.2.0)

The case of issue 42: a GPT-2-shaped model with random weights (6 blocks, width 512, GPT-2's
vocabulary size), 512 documents of 16 to 128 tokens, batches of 16, the residual stream after
block 2 with every real token stored (about 130 MB of rows). The bare loop runs the same model
up to that block on the same right-padded batches and keeps nothing. Two peaks of each
process: its resident memory (VmHWM), and its private memory (RssAnon, read every 5 ms by a
thread of its own): resident memory also counts the pages of the checkpoint that transformers
maps from its safetensors file, resident once read (probe reads every weight once, for the
file's model fingerprint, and its dry run runs the whole model) and reclaimable by the kernel
at any time, which private memory leaves out. Medians of --repeat rounds, the versions
alternating in each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# the run, as the command line would run it, with the checkout given first on the path
_PROBE = """import sys; sys.path.insert(0, {repo!r})
import probe
from probe.config.compose import compose
probe.run(compose(["model=transformers", "model.name={model}", "dataset=text",
                   "dataset.path={docs}", "layers=[transformer.h.2]", "batch_size=16",
                   "output.path={out}", "output.overwrite=true", "device=cpu"]))
"""
# the same model up to block 2 on the same batches (dataset order), nothing kept
_BARE = """import sys; sys.path.insert(0, {repo!r})
import torch
from transformers import AutoModelForCausalLM
from probe.config.compose import compose
from probe.data.feed import Batching
from probe.families.build import build_dataset
cfg = compose(["model=transformers", "model.name={model}", "dataset=text",
               "dataset.path={docs}", "layers=[transformer.h.2]", "output.path={out}"])
dataset = build_dataset(cfg)
model = AutoModelForCausalLM.from_pretrained("{model}").eval()
model.transformer.h = model.transformer.h[:3]
with torch.inference_mode():
    for batch in dataset.feed.loader(dataset, list(range(len(dataset))), Batching(16)):
        model.transformer(**batch.inputs)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, default=None,
                        help="another checkout of probe to measure beside this one")
    parser.add_argument("--docs", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--held", action="store_true",
                        help="glibc's allocator returns every block of 128 KiB or more at its "
                             "free (MALLOC_MMAP_THRESHOLD_), so that the peaks count memory "
                             "held, not what the allocator keeps after frees, which varies run "
                             "to run by tens of MiB")
    args = parser.parse_args()
    if args.held:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    from transformers import AutoTokenizer

    from benchmarks.bench_text import corpus
    from tests.tiny_text import tiny_gpt2

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tiny_gpt2(tmp / "gpt2", layers=6, width=512, heads=8, positions=1024,
                          vocab=50257)
        docs = corpus(tmp, args.docs, AutoTokenizer.from_pretrained(model))
        runs = {"probe (this checkout)": (_PROBE, REPO), "bare loop": (_BARE, REPO)}
        if args.other is not None:
            runs[f"probe ({args.other})"] = (_PROBE, args.other.resolve())
        peaks: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, (code, repo) in runs.items():
                peaks[name].append(_peaks(code.format(repo=str(repo), model=model, docs=docs,
                                                      out=tmp / "f.h5")))
        bare = statistics.median(private for _, private in peaks["bare loop"])
        print(f"{args.docs} documents, batches of 16, transformer.h.2, every token; medians of "
              f"{args.repeat}{'; memory held (--held)' if args.held else ''} "
              f"({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end)")
        print(f"  {'':<40} {'resident':>9} {'private':>9}")
        for name, values in peaks.items():
            resident = statistics.median(v[0] for v in values)
            private = statistics.median(v[1] for v in values)
            runs_ = ", ".join(f"{v[1]:.0f}" for v in values)
            print(f"  {name:<40} {resident:5.0f} MiB {private:5.0f} MiB  ({private - bare:+4.0f} "
                  f"MiB private over the bare loop; runs {runs_})")


# a thread of the measured process reads its private memory every 5 ms
_SAMPLER = """import threading, time
def _private():
    return int(open('/proc/self/status').read().split('RssAnon:')[1].split()[0])
_peak = [0]
def _watch():
    while True:
        _peak[0] = max(_peak[0], _private())
        time.sleep(0.005)
threading.Thread(target=_watch, daemon=True).start()
"""


def _peaks(code: str) -> tuple[float, float]:
    """The peak resident (VmHWM) and peak private memory (MiB) of a fresh ``python -c code``."""
    code = _SAMPLER + code + (
        "\n_peak[0] = max(_peak[0], _private())\n"
        "print(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]), _peak[0])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    resident, private = result.stdout.split()[-2:]
    return int(resident) / 1024, int(private) / 1024


if __name__ == "__main__":
    main()
