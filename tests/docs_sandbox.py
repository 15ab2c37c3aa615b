"""The folder that the commands of the docs run in (tests/test_docs.py): the data files they
name, and tiny stand-ins for the Hugging Face checkpoints they name, put in the Hub cache under
the real ids, so that ``model.name=gpt2`` loads offline as the docs show it.

    docs.jsonl  prompts.jsonl  ids.jsonl  images/{cat,dog}/  pairs.csv  clips/{yes,no}/  clips.csv
    tiny-clip.json  chats.jsonl  chatml.jinja  pairs.jsonl (text, translation)
    gpt2, facebook/dinov2-with-registers-small, google/vit-base-patch16-224,
    openai/clip-vit-base-patch32, facebook/wav2vec2-base, facebook/wav2vec2-base-960h,
    llava-hf/llava-1.5-7b-hf, Qwen/Qwen2-VL-2B-Instruct, MCG-NJU/videomae-base,
    meta-llama/Llama-3.2-1B, t5-small, openai/whisper-base
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["make_sandbox", "HUB_IDS"]

HUB_IDS = ("gpt2", "facebook/dinov2-with-registers-small", "google/vit-base-patch16-224",
           "openai/clip-vit-base-patch32", "facebook/wav2vec2-base",
           "facebook/wav2vec2-base-960h", "llava-hf/llava-1.5-7b-hf", "Qwen/Qwen2-VL-2B-Instruct",
           "MCG-NJU/videomae-base", "meta-llama/Llama-3.2-1B", "t5-small",
           "openai/whisper-base")
_TINY_CLIP = {"embed_dim": 16,
              "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8,
                             "head_width": 16},
              "text_cfg": {"context_length": 12, "vocab_size": 49408, "width": 32, "heads": 2,
                           "layers": 2}}


_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
           "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_sandbox(root: Path) -> Path:
    """The sandbox's files in ``root``, and the stand-ins in the Hub cache ($HF_HOME)."""
    from tests.tiny_archs import tiny_checkpoint
    from tests.tiny_audio import ctc_tokenizer, tiny_wav2vec2, tiny_whisper, tone, write_wav
    from tests.tiny_text import documents, tiny_gpt2, write_jsonl
    from tests.tiny_video import tiny_videomae
    from tests.tiny_vision import CAPTIONS, tiny_clip, tiny_dinov2, tiny_vit
    from tests.tiny_vlm import tiny_vlm

    root.mkdir(parents=True, exist_ok=True)
    texts = documents(12, seed=3, high=24)
    write_jsonl(root / "docs.jsonl", texts, labels=[n % 2 for n in range(12)])
    write_jsonl(root / "prompts.jsonl", documents(6, seed=4, low=2, high=8))
    rng = np.random.default_rng(0)
    with (root / "ids.jsonl").open("w") as stream:
        for n in range(8):
            stream.write(json.dumps({"input_ids": rng.integers(0, 150, 5 + 3 * n).tolist()})
                         + "\n")
    images = _images(root / "images")
    with (root / "pairs.csv").open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["image", "text"])
        writer.writerows(zip([str(p.relative_to(root)) for p in images], CAPTIONS,
                             strict=False))
    clips = [write_wav(root / "clips" / word / f"{n}.wav", tone(1 + n % 3, seed=n))
             for n, word in enumerate(["yes", "no"] * 3)]
    with (root / "clips.csv").open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["audio", "label", "transcript"])
        writer.writerows((str(p.relative_to(root)), p.parent.name, "abc hid")
                         for p in clips)
    (root / "tiny-clip.json").write_text(json.dumps(_TINY_CLIP))
    words = documents(8, seed=5, low=2, high=6)
    with (root / "chats.jsonl").open("w") as stream:
        for question, answer in zip(words[::2], words[1::2], strict=True):
            stream.write(json.dumps({"messages": [{"role": "user", "content": question},
                                                  {"role": "assistant", "content": answer}]})
                         + "\n")
    (root / "chatml.jinja").write_text(_CHATML)
    sources, targets = documents(4, seed=6, low=2, high=8), documents(4, seed=7, low=1, high=6)
    with (root / "pairs.jsonl").open("w") as stream:  # an encoder-decoder's text and target
        for source, target in zip(sources, targets, strict=True):
            stream.write(json.dumps({"text": source, "translation": target}) + "\n")
    made = tempfile.mkdtemp(prefix="probe-docs-models-")
    for hub_id, make in (
            ("gpt2", lambda d: tiny_gpt2(d, layers=12)),
            ("facebook/dinov2-with-registers-small", tiny_dinov2),
            ("google/vit-base-patch16-224", tiny_vit),
            ("openai/clip-vit-base-patch32", tiny_clip),
            ("facebook/wav2vec2-base", lambda d: tiny_wav2vec2(d, masked=False)),
            ("facebook/wav2vec2-base-960h",
             lambda d: ctc_tokenizer(tiny_wav2vec2(d, head="ctc"))),
            ("llava-hf/llava-1.5-7b-hf", lambda d: tiny_vlm("llava", d)),
            ("Qwen/Qwen2-VL-2B-Instruct", lambda d: tiny_vlm("qwen2_vl", d)),
            ("MCG-NJU/videomae-base", tiny_videomae),
            ("meta-llama/Llama-3.2-1B", lambda d: tiny_checkpoint("llama", d)),
            ("t5-small", lambda d: tiny_checkpoint("t5", d)),
            ("openai/whisper-base", lambda d: ctc_tokenizer(tiny_whisper(d)))):
        _cache(hub_id, make(Path(made) / hub_id.replace("/", "--")))
    return root


def _images(root: Path) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(1)
    paths = []
    for n, (w, h) in enumerate(((40, 30), (64, 80), (33, 33)) * 2):
        path = root / ("cat", "dog")[n % 2] / f"{n}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return sorted(paths)


def _cache(hub_id: str, folder: Path) -> None:
    # the Hub cache's own layout: models--<org>--<name>/snapshots/<commit>/ and refs/main
    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{hub_id.replace('/', '--')}"
    commit = "0" * 40
    shutil.copytree(folder, repo / "snapshots" / commit, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
