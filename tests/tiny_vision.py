"""Tiny Hugging Face vision and image-text checkpoints, and real image files, made on the fly:
no downloads. Import lazily (transformers takes seconds to import)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

CAPTIONS = ("a red cat", "the big dog sat", "a small bird on a tree", "blue house",
            "the quick dog ran under a tree", "a cat")


def pictures(root: Path, sizes=((40, 30), (64, 80), (33, 33)), classes: int = 2) -> list[Path]:
    """Real PNG files of several sizes (width, height), in ``classes`` class subfolders."""
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for n, (w, h) in enumerate(sizes * 2):
        folder = root / f"class{n % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{n}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return sorted(paths)


def _processor(directory: Path, size: int, crop: bool = False) -> None:
    from transformers import ViTImageProcessor

    ViTImageProcessor(size={"height": size, "width": size}, image_mean=[0.4, 0.5, 0.6],
                      image_std=[0.2, 0.25, 0.3]).save_pretrained(directory)


def tiny_vit(directory: Path, *, size: int = 32, patch: int = 8, labels: int = 3,
             seed: int = 0) -> Path:
    """A 2-block ViT classifier, 32 wide, on ``size`` px images, and its image processor."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, image_size=size, patch_size=patch,
                       num_labels=labels)
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(directory)
    _processor(directory, size)
    return directory


def tiny_dinov2(directory: Path, *, registers: int = 4, size: int = 32, patch: int = 8,
                seed: int = 0) -> Path:
    """A 2-block DINOv2 with ``registers`` register tokens, and an image processor."""
    import torch
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    config = Dinov2WithRegistersConfig(hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, mlp_ratio=2, image_size=size,
                                       patch_size=patch, num_register_tokens=registers)
    torch.manual_seed(seed)
    model = Dinov2WithRegistersModel(config)
    with torch.no_grad():  # random registers, unlike the class token: never confused
        model.embeddings.register_tokens.normal_()
        model.embeddings.cls_token.normal_()
    model.save_pretrained(directory)
    _processor(directory, size)
    return directory


def _clip_tokenizer(directory: Path, length: int):
    """A CLIP-style BPE tokenizer trained here on the captions' words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_text import WORDS, documents

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "<unk>", "<start>", "<end>"]
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=specials)
    bpe.train_from_iterator([*documents(200, seed=5), *WORDS, *CAPTIONS], trainer)
    start, end = bpe.token_to_id("<start>"), bpe.token_to_id("<end>")
    bpe.post_processor = processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", start), ("<end>", end)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>",
                                        unk_token="<unk>", bos_token="<start>",
                                        eos_token="<end>", model_max_length=length)
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_clip(directory: Path, *, kind: str = "clip", size: int = 32, patch: int = 8,
              length: int = 12, seed: int = 0) -> Path:
    """A CLIP (or, with kind="siglip", a SigLIP) of 2-block towers 32 wide, with its image
    processor and a tokenizer of ``length`` positions."""
    import torch
    import transformers

    tokenizer = _clip_tokenizer(directory, length)
    text = {"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": length,
            "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": size, "patch_size": patch}
    if kind == "clip":
        config = transformers.CLIPConfig(text_config=text, vision_config=vision,
                                         projection_dim=16)
        model = transformers.CLIPModel
    else:
        config = transformers.SiglipConfig(text_config=text, vision_config=vision)
        model = transformers.SiglipModel
    torch.manual_seed(seed)
    model(config).save_pretrained(directory)
    _processor(directory, size)
    return directory


def write_pairs(path: Path, images: list[Path], captions=CAPTIONS) -> Path:
    """A pairs file (csv or jsonl, by its suffix) of image paths, relative to its folder, and
    captions."""
    rows = [{"image": str(image.relative_to(path.parent)), "text": text}
            for image, text in zip(images, captions, strict=False)]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        import csv

        with path.open("w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=["image", "text"])
            writer.writeheader()
            writer.writerows(rows)
    return path
