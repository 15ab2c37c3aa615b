"""Model construction: torchvision models by name, with random, named or local weights."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError

__all__ = ["torchvision_model", "load_checkpoint"]

log = logging.getLogger(__name__)


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
    if weights is None or _looks_like_path(weights):
        model = tvm.get_model(name, weights=None)
        if weights is not None:
            load_checkpoint(model, weights)
    else:
        model = tvm.get_model(name, weights=_weights_enum(tvm, name, str(weights)))
    return model.eval()


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Load a state_dict saved with ``torch.save`` into ``model`` (``weights_only=True``).

    Raises:
        DataError: the file does not exist.
        ConfigError: the file is not a state_dict for this model.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"model.weights={str(path)!r}: no such checkpoint file")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()[0]
        raise ConfigError(
            f"model.weights={str(path)!r} is not a state_dict of this model: {first}"
        ) from None
    log.info("loaded weights from %s", path)


def _looks_like_path(weights: str) -> bool:
    text = str(weights)
    return "/" in text or text.startswith(".") or text.endswith((".pt", ".pth", ".ckpt", ".bin"))


def _weights_enum(tvm, name: str, weights: str):
    enum = tvm.get_model_weights(name)
    names = ["DEFAULT", *enum.__members__]
    if weights not in names:
        raise ConfigError(
            f"model.weights={weights!r} is not a weights name of {name}; choose one of "
            f"{', '.join(names)}, null for a random init, or the path of a local checkpoint"
        )
    return enum[weights] if weights != "DEFAULT" else enum.DEFAULT
