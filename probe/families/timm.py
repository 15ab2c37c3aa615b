"""timm models by name: ``model=timm model.name=vit_base_patch16_224``.

Weights: null (random init, seeded by ``seed``, offline), ``pretrained`` (timm's weights
through the Hugging Face cache: offline once cached), or the path of a local state_dict. Needs
the ``timm`` extra; runs of other models never import timm.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from probe.data.feed import Batch
from probe.data.layouts import PatchGrid, RowLayout
from probe.errors import ConfigError, DataError
from probe.families.base import Family, made_of
from probe.families.checkpoints import load_checkpoint, looks_like_path
from probe.families.registry import register

__all__ = ["timm_model", "FAMILY"]


def timm_model(name: str, weights: str | None = None, **options) -> nn.Module:
    """A timm model in eval mode.

    Args:
        name: any ``timm.list_models()`` name, with a pretrained tag or without
            (``vit_base_patch16_clip_224.openai``).
        weights: None (random init), ``pretrained``, or the path of a local state_dict.
        options: passed to ``timm.create_model`` (``+model.img_size=384``,
            ``+model.num_classes=0``).

    Raises:
        ConfigError: timm is not installed, or the name (or weights value) is unknown.
        DataError: the checkpoint does not exist, or pretrained weights are neither cached nor
            downloadable.
    """
    timm = _timm()
    name = str(name)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"model.name={name!r} is not a timm model.{hint} "
                          "timm.list_models('*vit*') lists them by pattern.")
    if weights not in (None, "pretrained") and not looks_like_path(str(weights)):
        raise ConfigError(f"model.weights={weights!r}: use null (random init), pretrained, or "
                          "the path of a local state_dict")
    try:
        model = timm.create_model(name, pretrained=weights == "pretrained", **options)
    except TypeError as err:  # an option the model does not take
        raise ConfigError(f"model.name={name!r}: {err}") from None
    except (OSError, RuntimeError) as err:
        if weights != "pretrained":
            raise
        first = str(err).strip().splitlines()[0]
        raise DataError(
            f"model.name={name!r} model.weights=pretrained: timm could not load the weights "
            f"({first}); on a machine without internet, download them once where there is a "
            "network and copy the Hugging Face cache (~/.cache/huggingface, or $HF_HOME) here, "
            "or pass a local state_dict as model.weights"
        ) from None
    if weights not in (None, "pretrained"):
        load_checkpoint(model, str(weights))
    return model.eval()


class TimmFamily(Family):
    name = "timm"
    libraries = ("timm",)

    def recognizes(self, model: nn.Module) -> bool:
        return made_of(model, "timm")

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        # timm's own: resolve_data_config + create_transform (CLIP's mean and std, bicubic, ...)
        timm = _timm()
        pretrained = timm.models.get_pretrained_cfg(str(model_cfg.name))
        config = timm.data.resolve_data_config(
            {}, pretrained_cfg=pretrained.to_dict() if pretrained is not None else None)
        return timm.data.create_transform(**config)

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        # timm's vision transformers (ViT, DeiT, DINOv2, EVA, BEiT, CLIP and SigLIP towers)
        # keep num_prefix_tokens class and register tokens before the patches
        vit = next((m for m in model.modules()
                    if hasattr(m, "num_prefix_tokens") and hasattr(m, "patch_embed")), None)
        if vit is None or not isinstance(batch.inputs, torch.Tensor):
            return batch.layout
        embed = vit.patch_embed
        size = tuple(batch.inputs.shape[-2:])
        grid = (tuple(embed.dynamic_feat_size(size)) if getattr(embed, "dynamic_img_size", False)
                else tuple(embed.grid_size))
        return PatchGrid(int(vit.num_prefix_tokens), (int(grid[0]), int(grid[1])))


FAMILY = register(TimmFamily())


def _timm():
    try:
        import timm
    except ImportError:
        raise ConfigError("model=timm needs timm: pip install 'probe[timm]'") from None
    return timm
