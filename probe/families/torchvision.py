"""torchvision models by name: ``model=torchvision model.name=alexnet`` (and the vgg16, resnet18,
resnet50 and vit_b_16 groups).

Weights: null (random init, seeded by ``seed``), a torchvision weights name such as ``DEFAULT``
(downloaded once into torch's hub cache), or the path of a local state_dict. Named weights bring
their own evaluation transform; a vision transformer's blocks give token layouts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import nn

from probe.data.feed import Batch
from probe.data.layouts import PatchGrid, RowLayout
from probe.errors import ConfigError, DataError
from probe.families.base import Family, made_of
from probe.families.checkpoints import load_checkpoint, looks_like_path
from probe.families.registry import register

__all__ = ["torchvision_model", "FAMILY"]


def torchvision_model(name: str, weights: str | None = None) -> nn.Module:
    """Build a torchvision model, in eval mode.

    Args:
        name: a name from ``torchvision.models.list_models()``, e.g. ``vgg16``.
        weights: None for a random init (seed it with ``torch.manual_seed`` first), a torchvision
            weights name such as ``DEFAULT`` or ``IMAGENET1K_V1``, or the path of a local
            checkpoint holding a state_dict.

    Raises:
        ConfigError: the name or the weights name is unknown.
        DataError: the checkpoint file does not exist.
    """
    import torchvision.models as tvm

    name = str(name)
    known = tvm.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"model.name={name!r} is not a torchvision model.{hint} "
            "Run python -c 'import torchvision; print(torchvision.models.list_models())' for all."
        )
    if weights is None or looks_like_path(weights):
        model = tvm.get_model(name, weights=None)
        if weights is not None:
            load_checkpoint(model, weights)
    else:
        model = _pretrained(tvm, name, _weights_enum(tvm, name, str(weights)), str(weights))
    return model.eval()


class TorchvisionFamily(Family):
    name = "torchvision"
    libraries = ("torchvision",)

    def recognizes(self, model: nn.Module) -> bool:
        return made_of(model, "torchvision.models")

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        import torchvision.models as tvm

        weights = model_cfg.get("weights")
        named = weights is not None and not looks_like_path(str(weights))
        if str(model_cfg.name) in tvm.list_models(module=tvm.video):
            # a video model's preprocessing is its weights' own, even for a random init or a
            # checkpoint of one's own: the clips it was made for
            return VideoTransform(_weights_enum(tvm, str(model_cfg.name),
                                                str(weights) if named else "DEFAULT"))
        if not named:
            return None
        return _weights_enum(tvm, str(model_cfg.name), str(weights)).transforms()

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        # a vision transformer's blocks: the class token, then the patches on their grid
        from torchvision.models.vision_transformer import VisionTransformer

        vit = next((m for m in model.modules() if isinstance(m, VisionTransformer)), None)
        if vit is None or not isinstance(batch.inputs, torch.Tensor):
            return batch.layout
        height, width = batch.inputs.shape[-2:]
        return PatchGrid(1, (height // vit.patch_size, width // vit.patch_size))


FAMILY = register(TorchvisionFamily())


class VideoTransform:
    """A torchvision video model's evaluation transform (``VideoClassification``: resize,
    crop, normalise) as the transform of ``dataset=video``: a window's (frames, H, W, 3) uint8
    frames in, the (3, frames, h, w) clip the model takes out; ``frames`` is the clip length
    its weights were trained and evaluated with (their docs' ``clip_len``)."""

    def __init__(self, weights):
        self.preset = weights.transforms()
        found = re.search(r"clip_len=(\d+)", weights.meta.get("_docs", ""))
        self.frames = int(found.group(1)) if found else None

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        return self.preset(frames.permute(0, 3, 1, 2))

    def __repr__(self) -> str:
        return repr(self.preset)


def _weights_enum(tvm, name: str, weights: str):
    enum = tvm.get_model_weights(name)
    names = list(dict.fromkeys(["DEFAULT", *enum.__members__]))  # DEFAULT is also a member
    if weights not in names:
        raise ConfigError(
            f"model.weights={weights!r} is not a weights name of {name}; choose one of "
            f"{', '.join(names)}, null for a random init, or the path of a local checkpoint"
        )
    return enum[weights] if weights != "DEFAULT" else enum.DEFAULT


def _pretrained(tvm, name: str, weights, asked: str) -> nn.Module:
    # torchvision downloads the file once into the hub cache; without a network, say where
    # to put it by hand
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    try:
        return tvm.get_model(name, weights=weights)
    except OSError as err:  # URLError, socket errors, a refused connection
        if cached.is_file():
            raise
        reason = getattr(err, "reason", None) or err.strerror or err
        raise DataError(
            f"model.weights={asked}: torchvision could not download {weights.url} ({reason}); "
            f"on a machine without internet, copy {cached.name} into {cached.parent} (or under "
            "$TORCH_HOME/hub/checkpoints) from a machine that has it, or use model.weights=null "
            "or the path of a local checkpoint"
        ) from None
