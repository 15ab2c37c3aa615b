"""What a transform does, in words, for the file's ``transform`` attr: ``describe_transform``.

Each model family knows its own evaluation preprocessing (``Family.transform``: torchvision
weights' ``transforms()``, timm's ``resolve_data_config`` + ``create_transform``); this module
only describes whatever transform a dataset ends up with.
"""

from __future__ import annotations

from collections.abc import Callable

from probe.errors import ConfigError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "imagenet_transform", "resolve_transform",
           "describe_transform"]

# the normalisation of imagenet_transform and cifar10 (undone for display by probe.analyses.gradcam)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)



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


def imagenet_transform(image_size: int = 224):
    """The standard ImageNet evaluation transform: resize, centre crop, to tensor, normalise."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(int(round(image_size * 256 / 224))),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def resolve_transform(transform: str | Callable, default: Callable[[], Callable]) -> Callable:
    # a transform object from probe.families.build, or the dataset's own for auto and imagenet
    if callable(transform):
        return transform
    if str(transform) not in ("auto", "imagenet"):
        raise ConfigError(f"dataset.transform={transform!r} is unknown; use auto (the model's own "
                          "preprocessing) or imagenet")
    return default()
