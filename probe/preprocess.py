"""Each model's own evaluation preprocessing, for ``dataset.transform=auto``.

``model_transform(model_cfg)`` finds it from the model's config alone, without building the
model: the torchvision weights' ``transforms()`` when named weights are used, timm's
``resolve_data_config`` + ``create_transform`` for a timm model, and None otherwise (the
dataset's own default, the ImageNet transform). ``describe_transform`` says what a transform
does, for the file's attrs.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

__all__ = ["model_transform", "describe_transform"]

_TORCHVISION = "probe.models.torchvision_model"
_TIMM = "probe.timm_models.timm_model"


def model_transform(model_cfg: DictConfig) -> Callable | None:
    """The evaluation transform that the config's model was trained with, or None."""
    target = str(model_cfg.get("_target_", ""))
    if target == _TORCHVISION:
        from probe.models import _looks_like_path, _weights_enum

        weights = model_cfg.get("weights")
        if weights is None or _looks_like_path(str(weights)):
            return None
        import torchvision.models as tvm

        return _weights_enum(tvm, str(model_cfg.name), str(weights)).transforms()
    if target == _TIMM:
        from probe.timm_models import _timm

        timm = _timm()
        pretrained = timm.models.get_pretrained_cfg(str(model_cfg.name))
        config = timm.data.resolve_data_config(
            {}, pretrained_cfg=pretrained.to_dict() if pretrained is not None else None)
        return timm.data.create_transform(**config)
    return None


def describe_transform(transform) -> dict:
    """The transform's repr and what it resolves to: resize (the shorter side, or [h, w]),
    crop ([h, w]), interpolation, mean, std."""
    found: dict = {"repr": " ".join(repr(transform).split())}
    for step in getattr(transform, "transforms", [transform]):
        kind = type(step).__name__
        if kind == "ImageClassification":  # torchvision weights' transforms()
            found.update(resize=list(step.resize_size), crop=_size(step.crop_size),
                         interpolation=step.interpolation.value, mean=list(step.mean),
                         std=list(step.std))
        elif kind == "Resize":
            found.update(resize=[step.size] if isinstance(step.size, int) else list(step.size),
                         interpolation=_mode(step.interpolation))
        elif kind == "CenterCrop":
            found["crop"] = _size(step.size)
        elif kind == "Normalize":
            found.update(mean=[float(v) for v in step.mean], std=[float(v) for v in step.std])
    return found


def _size(size) -> list[int]:
    # a crop as [height, width]
    size = [int(size)] if isinstance(size, int) else [int(v) for v in size]
    return size * 2 if len(size) == 1 else size


def _mode(interpolation) -> str:
    return getattr(interpolation, "value", str(interpolation))
