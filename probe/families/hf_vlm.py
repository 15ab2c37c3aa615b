"""Hugging Face vision-language models: ``model=transformers model.name=<image-text-to-text
checkpoint>`` (LLaVA, Qwen2-VL, Idefics3 / SmolVLM, PaliGemma, Gemma 3, ...), served through
probe.families.transformers, which builds them; a checkpoint whose class is one of
transformers' image-text-to-text models is sent here.

- Data: ``dataset=pairs`` (images with prompts), through the checkpoint's own processor
  (``AutoProcessor``), which this family hands to the dataset as its ``tokenizer``
  (``ProcessorPrompts``): the prompt goes through the processor's chat template as a user turn
  of the images and the text (``dataset.chat_template``), unless it holds the image
  placeholder already.
- Rows (``ImageText``): the language model's layers store a row per position of the processed
  sequence, image placeholders included, with ``/modality`` (0 text, 1 image) and ``/patch``
  (an image row's row and column on its image's grid of tokens, -1 on text rows; a model that
  tiles an image, Idefics3's, places it on its tile's grid). The vision tower's and the
  projector's layers store a row per image, as a vision transformer's do, where each sample
  has one image that reaches the tower whole.
- Generation: the language model's own, as a language model's (probe.families.transformers);
  the answer's rows have ``/modality`` 0.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import Reduce
from probe.data.feed import Batch, DataKind, Feed
from probe.data.layouts import SAMPLE_ROWS, ImageText, PatchGrid, Positions, RowLayout
from probe.errors import ConfigError, DataError
from probe.families.base import Family, graph_from
from probe.families.hf_attention import eager_patterns
from probe.families.hf_generation import generate, nll, top1
from probe.families.hf_heads import attention_heads
from probe.families.hf_names import hf_names
from probe.families.hf_verify import verify_run
from probe.families.hf_vision import vision_layout
from probe.families.hub import place, source_of, tokenizer_of
from probe.file.format import INPUT_IDS, MODALITY, PATCH, POSITIONS

__all__ = ["VisionLanguageFamily", "VISION_LANGUAGE", "is_vision_language", "ProcessorPrompts",
           "PARTS", "IMAGE", "TEXT"]

TEXT, IMAGE = 0, 1  # /modality's values (probe.file.format.VALUE_NAMES)

# each part of a vision-language model by the module names it starts at, as transformers'
# models name them; the projector first (Qwen2-VL's merger lies inside its vision tower)
PARTS = MappingProxyType({
    "projector": ("model.multi_modal_projector", "model.connector", "model.visual.merger"),
    "vision": ("model.vision_tower", "model.visual", "model.vision_model"),
    "language": ("model.language_model", "model.text_model", "lm_head"),
})
STANDARD_PREFIX = MappingProxyType({"vision": ("vision",)})  # the standard names' stack


def is_vision_language(cls: type) -> bool:
    """Whether a model class is one of transformers' image-text-to-text models."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return cls.__name__ in set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values())


class ProcessorPrompts:
    """A checkpoint's ``AutoProcessor`` as the pairs dataset's encoder
    (probe.data.pairs.PairEncoder): a sample's images and prompt in, the model's inputs out,
    batched by the processor itself (padded on the right). Picklable, for loader workers.

    Raises:
        DataError: the checkpoint has no processor that AutoProcessor can load.
    """

    def __init__(self, name: str, trust_remote_code: bool = False):
        from transformers import AutoProcessor

        self.name = name
        try:
            self.processor = AutoProcessor.from_pretrained(source_of(name),
                                                           trust_remote_code=trust_remote_code)
        except (OSError, ValueError, TypeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(f"model.name={name!r} has no processor that AutoProcessor can load "
                            f"({first}); save the checkpoint's processor beside its weights "
                            "(processor.save_pretrained(folder))") from None
        self.processor.tokenizer.padding_side = "right"  # the rows' layout pads on the right
        self.placeholder = str(getattr(self.processor, "image_token", "<image>"))
        self.chat = getattr(self.processor, "chat_template", None) is not None

    def prepared(self, chat_template: str | bool) -> ProcessorPrompts:
        setting = str(chat_template).lower()
        if setting not in ("auto", "true", "false"):
            raise ConfigError(f"dataset.chat_template={chat_template!r} is unknown; use auto, "
                              "true or false")
        if setting == "true" and not self.chat:
            raise ConfigError(f"dataset.chat_template=true: the processor of {self.name} has no "
                              "chat template; set dataset.chat_template=false and write the "
                              f"prompts as the model expects them (with {self.placeholder} "
                              "where each image goes)")
        prepared = copy.copy(self)
        prepared.chat = self.chat and setting != "false"
        return prepared

    def item(self, images: list, text: str, where: str) -> dict:
        found = text.count(self.placeholder)
        if found and found != len(images):
            raise DataError(f"{where}: its prompt holds {found} image placeholder(s) "
                            f"{self.placeholder} for {len(images)} image(s); give one image per "
                            "placeholder")
        if not found and self.chat:
            turn = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
            text = self.processor.apply_chat_template([{"role": "user", "content": turn}],
                                                      add_generation_prompt=True,
                                                      tokenize=False)
        return {"images": images, "text": text}

    def collate(self, items: list[dict]) -> tuple[dict, RowLayout]:
        made = self.processor(images=[item["images"] for item in items],
                              text=[item["text"] for item in items], padding=True,
                              return_tensors="pt")
        inputs = {key: value for key, value in made.items() if key != "labels"}
        ids, keep = inputs["input_ids"], inputs["attention_mask"].bool()
        positions = torch.arange(ids.shape[1]).expand(ids.shape)
        return inputs, Positions(keep, {INPUT_IDS: ids[keep].to(torch.int32),
                                        POSITIONS: positions[keep].to(torch.int32)})

    def attrs(self) -> dict:
        return {"processor": f"{type(self.processor).__name__}.from_pretrained({self.name!r})",
                "chat_template": str(self.chat).lower()}

    def __repr__(self) -> str:
        return f"ProcessorPrompts({self.name!r}, chat_template={self.chat})"


class VisionLanguageFamily(Family):
    """Image-text-to-text models (see the module's docstring): they generate as language
    models do; their data is images with prompts, and their rows carry each position's
    modality."""

    name = "transformers-vision-language"
    libraries = ("transformers",)
    reads = (DataKind.pairs,)
    towers = PARTS  # the listing's column: which part a layer belongs to
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    heads = staticmethod(attention_heads)  # do: heads (probe.families.hf_heads)
    place = staticmethod(place)  # a device map may spread the model (probe.families.hub)

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        return None  # the processor prepares the images (tokenizer)

    def tokenizer(self, model_cfg: DictConfig) -> ProcessorPrompts:
        return ProcessorPrompts(str(model_cfg.name),
                                bool(model_cfg.get("trust_remote_code", False)))

    def detokenizer(self, model_cfg: DictConfig) -> Callable[[list[list[int]]], list[str]]:
        tokenizer = tokenizer_of(str(model_cfg.name),
                                 bool(model_cfg.get("trust_remote_code", False)))
        return lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        if feed.kind is not DataKind.pairs:
            what = {DataKind.text: "text alone", DataKind.tensors: "images alone"}.get(
                feed.kind, feed.kind.value)
            raise ConfigError(_refusal(model, what))

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return _refusal(model, feed.kind.value)

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        return image_text_layout(model, batch)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        with graph_from(model.get_input_embeddings(), input_grad):
            return model(**_in_dtype(batch.inputs, model.dtype))

    def generate(self, model: nn.Module, inputs: dict, settings, all_logits: bool = False):
        return generate(model, _in_dtype(inputs, model.dtype), settings, all_logits)

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def objective(self, name: str, model: nn.Module) -> Callable:
        named = {"nll": nll, "top1": top1}
        if name not in named:
            raise ConfigError(f"objective={name!r} is unknown for a vision-language model; use "
                              "nll, top1, or a config with a _target_ callable")
        function = named[name]
        return lambda output, batch: function(output.logits, batch)

    def example_batch(self, model: nn.Module) -> Batch | None:
        return None  # its inputs are its processor's making: the dataset's first sample


# served through probe.families.transformers, which builds them (not registered: its family
# is the library's)
VISION_LANGUAGE = VisionLanguageFamily()


def _refusal(model: nn.Module, what: str) -> str:
    return (f"{type(model).__name__} is a vision-language model: it reads images with prompts, "
            f"not {what}; use dataset=pairs dataset.path=<a csv or jsonl with an image column "
            "(image files) and a text column (the prompts)>")


def _in_dtype(inputs: dict, dtype: torch.dtype) -> dict:
    # the processor's float inputs (pixels) in the model's dtype
    return {key: value.to(dtype) if isinstance(value, torch.Tensor)
            and value.is_floating_point() else value for key, value in inputs.items()}


def image_text_layout(model: nn.Module, batch: Batch) -> ImageText:
    """The rows of a vision-language batch (see the module's docstring): the feed's positions
    with each one's modality and patch place, and the layouts of the vision tower and the
    projector."""
    text = batch.layout  # the processor's positions (probe.data.layouts.Positions)
    ids, keep = batch.inputs["input_ids"].cpu(), text.keep.cpu()
    image = ids == _image_token(model.config)
    places = _places(image, _grids(model.config, batch.inputs, int(image.sum())))
    rows = {**text.rows, MODALITY: image[keep].to(torch.uint8), PATCH: places[keep]}
    text = replace(text, rows=rows, answer_fill={MODALITY: TEXT, PATCH: -1})
    return ImageText(text, _part_layouts(model, batch))


def _image_token(config) -> int:
    found = getattr(config, "image_token_id", None)
    return int(found if found is not None else config.image_token_index)


def _grids(config, inputs: Mapping, tokens: int) -> list[tuple[int, int]]:
    """The grid of tokens of each image (or tile) of the batch, in the order of their
    placeholders."""
    grid_thw = inputs.get("image_grid_thw")
    if grid_thw is not None:  # Qwen2-VL: each image's own (frames, rows, columns) of patches
        merge = int(getattr(config.vision_config, "spatial_merge_size", 1))
        return [(int(t) * int(h) // merge, int(w) // merge) for t, h, w in grid_thw.tolist()]
    side = _side(config)
    count = tokens // (side * side) if side else 0
    return [(side, side)] * count


def _side(config) -> int:
    """The side of the square grid of tokens an image (a tile) gives the language model."""
    per_image = getattr(config, "mm_tokens_per_image", None)  # Gemma 3: pooled patches
    if per_image:
        return math.isqrt(int(per_image))
    vision = config.vision_config
    side = int(vision.image_size) // int(_first(vision.patch_size))
    return side // int(getattr(config, "scale_factor", 1) or 1)  # Idefics3: pixel shuffle


def _first(value) -> int:
    return value if isinstance(value, int) else value[0]


def _places(image: torch.Tensor, grids: list[tuple[int, int]]) -> torch.Tensor:
    """(B, L, 2) int32: each image position's (row, column) on its grid, the grids taken in
    order over the batch's image positions (row by row); -1 elsewhere, and everywhere where
    the grids do not account for the positions (a layout this module does not know)."""
    places = torch.full((*image.shape, 2), -1, dtype=torch.int32)
    sizes = torch.tensor([rows * columns for rows, columns in grids], dtype=torch.long)
    if not grids or int(sizes.sum()) != int(image.sum()):
        return places
    owner = torch.repeat_interleave(torch.arange(len(grids)), sizes)
    within = torch.arange(int(sizes.sum())) - (sizes.cumsum(0) - sizes)[owner]
    columns = torch.tensor([c for _, c in grids], dtype=torch.long)[owner]
    places[image] = torch.stack([within // columns, within % columns], 1).to(torch.int32)
    return places


def _part_layouts(model: nn.Module, batch: Batch) -> tuple[tuple[tuple[str, ...],
                                                               RowLayout | str], ...]:
    """The vision tower's and the projector's layouts, or the line that refuses their layers
    for this batch."""
    modules = dict(model.named_modules())
    roots = {part: tuple(r for r in PARTS[part] if r in modules) for part in ("projector",
                                                                              "vision")}
    pixels = batch.inputs.get("pixel_values")
    images = _images(pixels)
    if images is None:
        line = ("the vision tower of {model} runs on the patches of all the batch's images as "
                "one sequence, with no axis of images, so its layers ({layer}) have no row per "
                "image; store layers of its language model, whose image rows carry /modality "
                "and /patch")
    elif images != len(batch):
        samples = f"{len(batch)} sample{'s' if len(batch) > 1 else ''}"
        line = (f"{images} images (or tiles) reach the vision tower for {samples}, "
                "so its layers ({layer}) have no row per sample; give one image per sample (a "
                "model that tiles images: turn its splitting off in the processor), or store "
                "layers of the language model, whose image rows carry /modality and /patch")
    else:
        line = None
    model_name = type(model).__name__
    config = model.config
    layouts = []
    for part in ("projector", "vision"):
        if not roots[part]:
            continue
        # the vision tower's layers by path, and by their standard names (vision.blocks.N:
        # probe.families.hf_names), which must be stored as their modules are
        named = (*roots[part], *STANDARD_PREFIX.get(part, ()))
        if line is not None:
            layouts.append((named, line.format(model=model_name,
                                               layer=", ".join(roots[part]))))
        elif part == "vision":
            vision = modules[roots[part][0]]
            layouts.append((named, vision_layout(config.vision_config, vision,
                                                 pixels.shape[-2:])))
        else:
            side = _side(config)
            layouts.append((named, PatchGrid(0, (side, side)) if side else SAMPLE_ROWS))
    return tuple(layouts)


def _images(pixels) -> int | None:
    """How many images reach the vision tower: (images, C, H, W), or (samples, tiles, C, H,
    W) pixels; None for patches of all images flattened (Qwen2-VL's (patches, features))."""
    if not isinstance(pixels, torch.Tensor) or pixels.dim() < 4:
        return None
    return int(math.prod(pixels.shape[:-3]))
