"""Hugging Face video models (VideoMAE, TimeSformer, ViViT, V-JEPA 2's encoder): the family
that ``model=transformers`` specialises to for a checkpoint whose model type has a video
processor in transformers and whose main input is a clip of frames.

- It reads ``dataset=video`` (probe.data.video): each window's frames go through the
  checkpoint's own video processor (``AutoVideoProcessor`` from the same folder or Hub id,
  with ``dataset.transform=auto``), and ``dataset.frames`` defaults to the frames the model
  was made for (its config's ``num_frames`` or ``frames_per_clip``).
- Row layouts (a ``PatchGrid`` of tubelets): the encoder's (B, prefix + t * h * w, D)
  outputs, a class token first where the model has one (TimeSformer, ViViT), then the
  tubelets: time first (VideoMAE, ViViT, V-JEPA 2) or last (TimeSformer), which
  ``tokens=patches`` stores as (features, time, height, width).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from probe.data.feed import Batch, DataKind, Feed
from probe.data.layouts import PatchGrid, RowLayout
from probe.families.base import Family
from probe.families.hf_attention import eager_patterns
from probe.families.hf_heads import attention_heads
from probe.families.hf_names import hf_names
from probe.families.hf_verify import verify_run
from probe.families.hf_vision import prefix_tokens
from probe.families.hub import ProcessorTransform, place, source_of

__all__ = ["VideoFamily", "VideoProcessorTransform", "VIDEO", "is_video"]

# model types whose tubelets run time last (the others: time first)
_TIME_LAST = ("timesformer",)


class VideoProcessorTransform(ProcessorTransform):
    """A checkpoint's ``AutoVideoProcessor`` as the transform of ``dataset=video``: a
    window's (frames, H, W, 3) uint8 frames in, the (frames, 3, h, w) ``pixel_values`` the
    processor makes out; ``frames`` is how many the model takes."""

    auto, what = "AutoVideoProcessor", "video"
    fix = "save one beside the weights (e.g. VideoMAEVideoProcessor(...).save_pretrained(folder))"

    def __init__(self, name: str):
        from transformers import AutoConfig

        super().__init__(name)
        config = AutoConfig.from_pretrained(source_of(name))
        found = getattr(config, "num_frames", None) or getattr(config, "frames_per_clip", None)
        self.frames = None if found is None else int(found)

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        # the processor samples no frames of its own: the window's frame rule chose them
        made = self.processor(videos=[frames], return_tensors="pt", do_sample_frames=False)
        return made[next(iter(made))][0]


def is_video(cls: type) -> bool:
    """Whether checkpoints of class ``cls`` read video: their model type has a video
    processor in transformers, and their main input is pixels (not token ids)."""
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    model_type = getattr(getattr(cls, "config_class", None), "model_type", None)
    return (model_type in VIDEO_PROCESSOR_MAPPING_NAMES
            and getattr(cls, "main_input_name", "") in ("pixel_values", "pixel_values_videos"))


class VideoFamily(Family):
    """Video encoders: fed each window's frames as their main input; their encoder outputs
    lie on a grid of tubelets (see the module's docstring)."""

    name = "transformers-video"
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    heads = staticmethod(attention_heads)  # do: heads (probe.families.hf_heads)
    libraries = ("transformers",)
    reads = (DataKind.video,)
    place = staticmethod(place)

    def transform(self, model_cfg: DictConfig) -> VideoProcessorTransform:
        return VideoProcessorTransform(str(model_cfg.name))

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return (f"{type(model).__name__} is a video model: it reads windows of video, not "
                f"{feed.kind.value}; use dataset=video dataset.root=<a folder of class "
                "subfolders of videos> (or dataset.path=<a .csv or .jsonl list of files>)")

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        return video_layout(model, batch.inputs.shape)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        pixels = batch.inputs.requires_grad_() if input_grad else batch.inputs
        return model(**{model.main_input_name: pixels})

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def example_batch(self, model: nn.Module) -> Batch:
        # one clip of the frames and size the model was made for
        config = model.config
        frames = getattr(config, "num_frames", None) or getattr(config, "frames_per_clip", 16)
        size = getattr(config, "image_size", None) or getattr(config, "crop_size", 224)
        channels = int(getattr(config, "num_channels", 3))
        return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                     torch.zeros(1, int(frames), channels, int(size), int(size)))


VIDEO = VideoFamily()


def video_layout(model: nn.Module, shape: torch.Size) -> PatchGrid:
    """The tubelet grid of a (B, frames, channels, H, W) input: the model's tubelet and
    patch sizes divide its frames, height and width."""
    config = model.config
    tubelet = getattr(config, "tubelet_size", None)
    patch = getattr(config, "patch_size", None)
    if isinstance(tubelet, (list, tuple)):  # ViViT: (time, height, width)
        sizes = tuple(int(n) for n in tubelet)
    else:  # a time extent (1 without one: TimeSformer) and a square patch
        sizes = (int(tubelet or 1), int(patch), int(patch))
    frames, height, width = shape[1], shape[-2], shape[-1]
    grid = (frames // sizes[0], height // sizes[1], width // sizes[2])
    embeddings = _encoder(model)
    if getattr(config, "model_type", "") in _TIME_LAST:
        return PatchGrid(prefix_tokens(embeddings), (*grid[1:], grid[0]),
                         ("height", "width", "time"))
    return PatchGrid(prefix_tokens(embeddings), grid, ("time", "height", "width"))


def _encoder(model: nn.Module) -> nn.Module:
    # the module that holds the embeddings: the model, its base model or its encoder
    for name in (getattr(model, "base_model_prefix", ""), "encoder", ""):
        found = getattr(model, name, None) if name else model
        if isinstance(found, nn.Module) and hasattr(found, "embeddings"):
            return found
    return model
