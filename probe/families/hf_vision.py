"""Hugging Face checkpoints that read pixels: ``model=transformers model.name=<vit folder>``.

Vision transformers (ViT, DeiT, BEiT, DINOv2 with or without registers) and the two-tower
image-text models (CLIP, SigLIP, ...), served through ``probe.families.transformers``, which
builds them; a checkpoint's main input (``pixel_values``) or its two towers send it here.

- ``dataset.transform=auto``: the checkpoint's own image processor (``AutoImageProcessor``
  from the same folder or Hub id), recorded in the file's ``transform`` attr.
- Row layouts (a ``PatchGrid``): the encoder's (B, prefix + rows * columns, D) outputs, whose
  first ``prefix`` positions are the class token and the register tokens (DINOv2's sit
  between them and the patches), so that ``tokens=patches`` keeps the patches alone on their grid.
- Two towers (``TwoTowerFamily``): an image dataset runs the vision tower
  (``get_image_features``), a text dataset the text tower (``get_text_features``), image-text
  pairs (dataset=pairs) the whole model, whose ``objective=similarity`` is each pair's matched
  logit (probe.families.towers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import Reduce
from probe.data.feed import Batch, DataKind, Feed
from probe.data.layouts import PatchGrid, RowLayout
from probe.families import towers as two_towers
from probe.families.base import Family, graph_from
from probe.families.hf_attention import eager_patterns
from probe.families.hf_heads import attention_heads
from probe.families.hf_names import hf_names
from probe.families.hf_verify import verify_run
from probe.families.hub import ProcessorTransform, place

__all__ = ["VisionFamily", "TwoTowerFamily", "ImageProcessorTransform", "VISION", "TWO_TOWERS",
           "is_two_tower", "vision_layout", "prefix_tokens"]


class ImageProcessorTransform(ProcessorTransform):
    """A checkpoint's ``AutoImageProcessor`` as a dataset transform: a PIL image (or array) in,
    the (3, H, W) ``pixel_values`` that the processor makes out."""

    auto, what = "AutoImageProcessor", "image"
    fix = ("save one beside the weights (e.g. ViTImageProcessor(...).save_pretrained(folder)), "
           "or use dataset.transform=imagenet")

    def __call__(self, image) -> torch.Tensor:
        return self.processor(images=image, return_tensors="pt")["pixel_values"][0]


class VisionFamily(Family):
    """Hugging Face models that read pixels: fed ``pixel_values``; their encoder outputs lie on
    a layout of a class token, register tokens and a grid of patches."""

    name = "transformers-vision"
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    heads = staticmethod(attention_heads)  # do: heads (probe.families.hf_heads)
    libraries = ("transformers",)
    reads = (DataKind.tensors,)
    place = staticmethod(place)  # a device map may spread the model (probe.families.hub)

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        return ImageProcessorTransform(str(model_cfg.name))

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return (f"{type(model).__name__} is a vision model: it reads images, not "
                f"{feed.kind.value}; use an image dataset (dataset=imagefolder dataset.root="
                "<folder of class subfolders>)")

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        return _image_layout(model, batch)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        pixels = batch.inputs.requires_grad_() if input_grad else batch.inputs
        return model(pixel_values=pixels)

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def example_batch(self, model: nn.Module) -> Batch:
        return _image_batch(model)


class TwoTowerFamily(Family):
    """Image-text models (CLIP, SigLIP): the tower that the data feeds runs (see the module's
    docstring)."""

    name = "transformers-two-tower"
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    libraries = ("transformers",)
    towers = MappingProxyType({"vision": ("vision_model", "visual_projection"),
                               "text": ("text_model", "text_projection")})
    place = staticmethod(place)  # a device map may spread the model (probe.families.hub)

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        return ImageProcessorTransform(str(model_cfg.name))

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        # images, text and pairs: each feeds a tower, or both
        two_towers.check_layers(feed, reduces, self.towers)

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        if isinstance(batch.inputs, dict) and "pixel_values" not in batch.inputs:
            return batch.layout  # text: the feed's real tokens
        layout = _image_layout(model, batch)  # images; pairs: the image's tokens
        two_towers.check_pair_lengths(batch.inputs, layout)
        return layout

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        inputs = batch.inputs
        if isinstance(inputs, torch.Tensor):
            return model.get_image_features(pixel_values=inputs.requires_grad_() if input_grad
                                            else inputs)
        with graph_from(model.text_model.embeddings.token_embedding, input_grad):
            if "pixel_values" in inputs:
                pixels = inputs["pixel_values"]
                return model(**{**inputs, "pixel_values": pixels.requires_grad_() if input_grad
                                else pixels})
            return model.get_text_features(**inputs)

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits_per_image", None)

    def objective(self, name: str, model: nn.Module) -> Callable:
        return two_towers.objective(name, self.logits)

    def example_batch(self, model: nn.Module) -> Batch:
        # an image and a caption at the text tower's length: the whole model runs
        image = _image_batch(model).inputs
        text = model.config.text_config
        return two_towers.example_pair(image, int(text.max_position_embeddings),
                                       int(text.vocab_size))


# served through probe.families.transformers, which builds them (not registered: its family
# is the library's)
VISION = VisionFamily()
TWO_TOWERS = TwoTowerFamily()
is_two_tower = two_towers.is_two_tower


def _image_layout(model: nn.Module, batch: Batch) -> RowLayout:
    pixels = _pixels(batch.inputs)
    if pixels is None:
        return batch.layout
    return vision_layout(_vision_config(model), _vision_module(model), pixels.shape[-2:])


def _image_batch(model: nn.Module) -> Batch:
    # one image at the size the model was made for
    config = _vision_config(model)
    size = _pair(getattr(config, "image_size", 224))
    channels = int(getattr(config, "num_channels", 3))
    return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                 torch.zeros(1, channels, *size))


def vision_layout(config, vision: nn.Module, size) -> PatchGrid:
    """The row layout of a Hugging Face vision encoder at image ``size`` (H, W): its class
    token, register tokens and distillation token first, then its patches, row by row."""
    patch = _pair(getattr(config, "patch_size", 16))
    return PatchGrid(prefix_tokens(vision), (int(size[0]) // patch[0], int(size[1]) // patch[1]))


@functools.lru_cache(maxsize=16)
def _prefix_of(embeddings: nn.Module) -> int:
    count = sum(getattr(embeddings, name, None) is not None
                for name in ("cls_token", "class_embedding", "distillation_token"))
    registers = getattr(embeddings, "register_tokens", None)
    return count + (0 if registers is None else int(registers.shape[-2]))


def prefix_tokens(vision: nn.Module) -> int:
    """How many class, register and distillation tokens come before the patches."""
    embeddings = getattr(vision, "embeddings", None)
    return 0 if embeddings is None else _prefix_of(embeddings)


def _vision_module(model: nn.Module) -> nn.Module:
    # the module that holds the patch embeddings: the model, its base model or its vision tower
    for name in ("vision_model", getattr(model, "base_model_prefix", ""), ""):
        found = getattr(model, name, None) if name else model
        if isinstance(found, nn.Module) and hasattr(found, "embeddings"):
            return found
    return model


def _vision_config(model: nn.Module):
    return getattr(model.config, "vision_config", None) or model.config


def _pixels(inputs) -> torch.Tensor | None:
    if isinstance(inputs, torch.Tensor):
        return inputs
    return inputs.get("pixel_values") if isinstance(inputs, dict) else None


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[-1])
