"""The configured device, checked: a missing explicit device is an error, never a fallback."""

from __future__ import annotations

import torch

from probe.errors import ConfigError, DeviceError

__all__ = ["resolve_device"]


def resolve_device(spec: str) -> torch.device:
    """Turn ``auto | cpu | cuda | cuda:N | mps`` into a device that exists here.

    ``auto`` picks CUDA, then MPS, then the CPU.

    Raises:
        ConfigError: the text is not a device name.
        DeviceError: the device is not available on this machine.
    """
    spec = str(spec).strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(
            f"device={spec!r} is not a device; use auto, cpu, cuda, cuda:N or mps"
        ) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise DeviceError(f"device={spec!r} but no CUDA device is available; use device=cpu")
        if device.index is not None and device.index >= count:
            raise DeviceError(
                f"device={spec!r} but this machine has {count} CUDA device(s): "
                f"use cuda:0 to cuda:{count - 1}"
            )
    elif device.type == "mps" and not _mps_available():
        raise DeviceError(f"device={spec!r} but MPS is not available; use device=cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device={spec!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
