"""Test models and datasets light enough to import in a CLI subprocess (no pytest, no
torchvision): ``model=custom model._target_=tests.tiny.TinyNet``."""

from __future__ import annotations

import os
import signal
import time

from torch import nn

from probe.data.images import SyntheticImages
from probe.errors import DataError


class TinyNet(nn.Module):
    """A small image classifier: two conv blocks (each conv followed by an in-place ReLU, as in
    vgg), global pooling and a linear head."""

    def __init__(self, width: int = 8, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))


class PacedImages(SyntheticImages):
    """Synthetic images that take ``delay`` seconds each to load, and send ``signum`` when
    item ``at`` is loaded: a run of a known length, stopped at a known moment. The signal goes
    to this process, or with ``group`` to its whole process group, as SLURM signals every
    process of a job (only in a process started with a session of its own). A CLI run takes
    ``at`` and ``signum`` from $PACED_SIGNAL_AT and $PACED_SIGNAL, which leave the config, and
    so the resume of the next run, as they are."""

    def __init__(self, *args, delay: float = 0.0, at: int | None = None,
                 signum: int = signal.SIGTERM, group: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if at is None and os.environ.get("PACED_SIGNAL_AT"):
            at = int(os.environ["PACED_SIGNAL_AT"])
            signum = int(os.environ.get("PACED_SIGNAL", signal.SIGTERM))
        self.delay, self.at, self.signum, self.group = float(delay), at, int(signum), group

    def __getitem__(self, index: int):
        if index == self.at:
            if self.group:
                os.killpg(os.getpgrp(), self.signum)
            else:
                os.kill(os.getpid(), self.signum)
        time.sleep(self.delay)
        return super().__getitem__(index)


class BrokenImages(PacedImages):
    """Paced synthetic images whose item ``broken`` cannot be read: a user error (DataError)
    in the middle of a run, as a corrupt file of an image folder would be."""

    def __init__(self, *args, broken: int = -1, **kwargs):
        super().__init__(*args, **kwargs)
        self.broken = int(broken)

    def __getitem__(self, index: int):
        if index == self.broken:
            raise DataError(f"sample {index} cannot be read")
        return super().__getitem__(index)
