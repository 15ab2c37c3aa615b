"""Image datasets: ``SyntheticImages`` (the embedded default, no files), ``image_folder`` and
``cifar10``. Any torch Dataset works as well; its items are a tensor or a (tensor, target) pair,
which the tensors feed (probe.data.tensors) batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from probe.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    imagenet_transform,
    resolve_transform,
)
from probe.errors import ConfigError, DataError

__all__ = ["SyntheticImages", "image_folder", "cifar10"]

class SyntheticImages(Dataset):
    """Seeded images whose class shows in the pixels; item i is the same on every run.

    Example::

        ds = SyntheticImages(num_samples=8, image_size=32)
        image, target = ds[3]          # (3, 32, 32) float32, int in [0, num_classes)

    Each class has its own colour and stripe frequency; unit Gaussian noise lies on top, so a
    linear probe on a model's features does well above chance even with random weights.
    """

    def __init__(self, num_samples: int = 64, image_size: int = 224, num_classes: int = 10,
                 seed: int = 0):
        for key, value in (("num_samples", num_samples), ("image_size", image_size),
                           ("num_classes", num_classes)):
            if int(value) < 1:
                raise ConfigError(f"dataset.{key}={value} must be at least 1")
        self.num_samples, self.image_size = int(num_samples), int(image_size)
        self.num_classes, self.seed = int(num_classes), int(seed)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} samples")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        target = int(torch.randint(self.num_classes, (1,), generator=g))
        noise = torch.randn(3, self.image_size, self.image_size, generator=g)
        return noise + self._pattern(target), target

    def _pattern(self, target: int) -> torch.Tensor:
        colour = torch.randn(3, generator=torch.Generator().manual_seed(target)).view(3, 1, 1)
        rows = torch.arange(self.image_size, dtype=torch.float32).view(1, -1, 1)
        stripes = torch.sin(2 * math.pi * (target + 1) * rows / self.image_size)
        return colour + stripes


def image_folder(root: str, image_size: int = 224,
                 transform: str | Callable = "auto") -> Dataset:
    """torchvision's ImageFolder (root/<class>/<image>).

    Args:
        root: the folder of class subfolders.
        image_size: the crop of the ImageNet evaluation transform.
        transform: ``auto`` or ``imagenet`` (the ImageNet evaluation transform at
            ``image_size``), or a transform (``dataset.transform=auto`` with a model that has
            its own preprocessing: probe.families.build passes that model's).

    Raises:
        DataError: root does not exist or holds no images in class subfolders.
    """
    from torchvision.datasets import ImageFolder

    path = Path(root).expanduser()
    if not path.is_dir():
        raise DataError(
            f"dataset.root={str(root)!r} is not a directory; point dataset.root at a folder "
            "of class subfolders (root/<class>/<image>)"
        )
    try:
        return ImageFolder(str(path), transform=resolve_transform(transform,
                                                           lambda: imagenet_transform(image_size)))
    except FileNotFoundError as err:
        raise DataError(f"dataset.root={str(root)!r}: {err}") from None


def cifar10(root: str, train: bool = False, download: bool = False, image_size: int = 32,
            transform: str | Callable = "auto"):
    """torchvision's CIFAR-10, normalised with the ImageNet statistics and resized when
    ``image_size`` is not 32; or with ``transform`` when it is one (see image_folder).

    Raises:
        DataError: the files are not under root and download is false.
    """
    from torchvision import transforms
    from torchvision.datasets import CIFAR10

    steps = [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    if image_size != 32:
        steps.insert(0, transforms.Resize(image_size))
    try:
        return CIFAR10(str(Path(root).expanduser()), train=train, download=download,
                       transform=resolve_transform(transform, lambda: transforms.Compose(steps)))
    except RuntimeError as err:
        if "not found" not in str(err).lower():
            raise
        raise DataError(
            f"CIFAR-10 is not under dataset.root={str(root)!r}; put the extracted "
            "cifar-10-batches-py there, or set dataset.download=true to fetch it"
        ) from None


