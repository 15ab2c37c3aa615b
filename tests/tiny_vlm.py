"""Tiny vision-language models, made on the fly with random weights: no downloads. Each
builder saves a model and its processor (image processor, a tokenizer trained here, a chat
template) with save_pretrained in a folder, as a checkpoint from the Hub would hold them.
Import lazily (transformers takes seconds to import).

    folder = tiny_vlm("llava", tmp_path / "llava")
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_text import documents

WIDTH = 32  # the language model's width
IMAGE = 32  # the vision tower's image size, in pixels

# a user turn of text and images, then the assistant's turn: what chat templates do
CHAT = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}{{ image }}{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def _tokenizer(specials: list[str], named: dict[str, str] | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=240, special_tokens=["<pad>", "<s>", "</s>",
                                                                  *specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(documents(200, seed=99), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>", bos_token="<s>",
                                        pad_token="<pad>", extra_special_tokens=named or {})
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def _llama(vocab: int, **extra):
    from transformers import LlamaConfig

    settings = {"hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "max_position_embeddings": 512, **extra}
    return LlamaConfig(vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       **settings)


def _chat(image_text: str) -> str:
    return CHAT.replace("{{ image }}", image_text)


def llava(folder: Path, image: int = IMAGE, patch: int = 8, vision: tuple[int, int, int] =
          (WIDTH, 2, 2), text: tuple[int, int, int] = (WIDTH, 2, 2)) -> None:
    """LLaVA-1.5's architecture: a CLIP vision tower of ``vision`` (width, blocks, heads) at
    ``image`` pixels in patches of ``patch``, a 2-layer projector, a Llama of ``text``."""
    import transformers as t

    tokenizer = _tokenizer(["<image>"])
    width, blocks, heads = vision
    tower = t.CLIPVisionConfig(hidden_size=width, intermediate_size=4 * width,
                               num_hidden_layers=blocks, num_attention_heads=heads,
                               image_size=image, patch_size=patch, projection_dim=width)
    width, blocks, heads = text
    language = _llama(len(tokenizer)) if text == (WIDTH, 2, 2) else _llama(
        len(tokenizer), hidden_size=width, intermediate_size=4 * width, num_hidden_layers=blocks,
        num_attention_heads=heads, num_key_value_heads=heads)
    config = t.LlavaConfig(vision_config=tower, text_config=language,
                           image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                           vision_feature_layer=-1)
    t.LlavaForConditionalGeneration(config).save_pretrained(folder)
    images = t.CLIPImageProcessor(size={"shortest_edge": image},
                                  crop_size={"height": image, "width": image})
    t.LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch,
                     vision_feature_select_strategy="default", num_additional_image_tokens=1,
                     chat_template=_chat("<image>")).save_pretrained(folder)


def qwen2_vl(folder: Path) -> None:
    import transformers as t

    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer = _tokenizer(specials)
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in specials}
    text = dict(vocab_size=len(tokenizer), hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]},
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    vision = dict(depth=2, embed_dim=WIDTH, hidden_size=WIDTH, num_heads=2, mlp_ratio=2,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_chans=3)
    config = t.Qwen2VLConfig(text_config=text, vision_config=vision,
                             image_token_id=ids["<|image_pad|>"],
                             video_token_id=ids["<|video_pad|>"],
                             vision_start_token_id=ids["<|vision_start|>"],
                             vision_end_token_id=ids["<|vision_end|>"], **text)
    t.Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    images = t.Qwen2VLImageProcessor(patch_size=4, merge_size=2, temporal_patch_size=2,
                                     min_pixels=IMAGE * IMAGE, max_pixels=IMAGE * IMAGE)
    t.Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer,
                       video_processor=t.Qwen2VLVideoProcessor(patch_size=4, merge_size=2),
                       chat_template=_chat("<|vision_start|><|image_pad|><|vision_end|>")
                       ).save_pretrained(folder)


def idefics3(folder: Path, split: bool = False) -> None:
    """Idefics3 (SmolVLM's architecture); ``split``: its processor cuts an image into tiles
    (4 and the whole image, downscaled), as the checkpoints do, else passes it whole."""
    import transformers as t

    tokenizer = _tokenizer(["<fake_token_around_image>", "<image>", "<global-img>",
                            "<end_of_utterance>"])
    vision = t.Idefics3VisionConfig(hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                                    num_hidden_layers=2, num_attention_heads=2,
                                    image_size=IMAGE, patch_size=8)
    config = t.Idefics3Config(vision_config=vision, text_config=_llama(len(tokenizer)),
                              scale_factor=2, pad_token_id=0,
                              image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    t.Idefics3ForConditionalGeneration(config).save_pretrained(folder)
    # tiles of IMAGE pixels, each (IMAGE / patch)^2 / scale^2 = 4 tokens
    images = t.Idefics3ImageProcessor(size={"longest_edge": 2 * IMAGE if split else IMAGE},
                                      max_image_size={"longest_edge": IMAGE},
                                      do_image_splitting=split)
    t.Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4,
                        chat_template=_chat("<image>")).save_pretrained(folder)


def paligemma(folder: Path) -> None:
    import transformers as t

    tokenizer = _tokenizer(["<image>"], {"image_token": "<image>"})
    vision = t.SiglipVisionConfig(hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                                  num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE,
                                  patch_size=8)
    text = t.GemmaConfig(vocab_size=len(tokenizer), hidden_size=WIDTH,
                         intermediate_size=2 * WIDTH, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = t.PaliGemmaConfig(vision_config=vision, text_config=text, projection_dim=WIDTH,
                               image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    t.PaliGemmaForConditionalGeneration(config).save_pretrained(folder)
    images = t.SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE})
    images.image_seq_length = (IMAGE // 8) ** 2
    t.PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)


def gemma3(folder: Path) -> None:
    import transformers as t

    named = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>",
             "eoi_token": "<end_of_image>"}
    tokenizer = _tokenizer(list(named.values()), named)
    ids = {key: tokenizer.convert_tokens_to_ids(value) for key, value in named.items()}
    vision = t.SiglipVisionConfig(hidden_size=WIDTH, intermediate_size=2 * WIDTH,
                                  num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE,
                                  patch_size=4)
    text = t.Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=WIDTH,
                              intermediate_size=2 * WIDTH, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              max_position_embeddings=512, sliding_window=64, pad_token_id=0,
                              bos_token_id=1, eos_token_id=2)
    # 8x8 patches pooled to 4x4 = 16 tokens per image
    config = t.Gemma3Config(vision_config=vision, text_config=text, mm_tokens_per_image=16,
                            boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
                            image_token_index=ids["image_token"])
    t.Gemma3ForConditionalGeneration(config).save_pretrained(folder)
    images = t.Gemma3ImageProcessor(size={"height": IMAGE, "width": IMAGE})
    t.Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=16,
                      chat_template=_chat("<start_of_image>")).save_pretrained(folder)


BUILDERS = {"llava": llava, "qwen2_vl": qwen2_vl, "idefics3": idefics3, "paligemma": paligemma,
            "gemma3": gemma3, "idefics3_tiles": lambda folder: idefics3(folder, split=True)}


def tiny_vlm(family: str, folder: Path, seed: int = 0) -> Path:
    """A tiny ``family`` model (a key of BUILDERS) and its processor, saved in ``folder``."""
    import torch

    torch.manual_seed(seed)
    BUILDERS[family](folder)
    return folder


def write_pairs(path: Path, images: list[str], prompts: list[str]) -> Path:
    with path.open("w") as stream:
        for image, prompt in zip(images, prompts, strict=True):
            stream.write(json.dumps({"image": image, "text": prompt}) + "\n")
    return path
