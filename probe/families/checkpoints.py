"""Local checkpoints: a state_dict saved with ``torch.save``, loaded into a model of any family
with ``weights_only=True`` (no code in the file runs)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError, ProbeError

__all__ = ["load_checkpoint", "looks_like_path"]

log = logging.getLogger(__name__)


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Load a state_dict saved with ``torch.save`` into ``model`` (``weights_only=True``: no
    code in the file ever runs). A state_dict saved from ``nn.DataParallel`` (every key starts
    with ``module.``) loads too.

    Raises:
        DataError: the file does not exist or cannot be read as a checkpoint.
        ConfigError: the file holds no state_dict, or one of another model.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"model.weights={str(path)!r}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a file of anything else fails in many ways inside the unpickler
        raise _unreadable(path, err) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"model.weights={str(path)!r} holds a {type(state).__name__}, not a "
                          "state_dict; save one with torch.save(model.state_dict(), path)")
    state = _matching_keys(model, state, path)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith("size mismatch")), lines[-1])
        raise ConfigError(f"model.weights={str(path)!r} does not fit this model: {first}"
                          .rstrip(".") + " (a checkpoint of another variant?)") from None
    log.info("loaded weights from %s", path)


def _matching_keys(model: nn.Module, state: dict, path: Path) -> dict:
    # the checkpoint's keys, or the error that names the first that do not match
    expected = set(model.state_dict())
    if set(state) == expected:
        return state
    parallel = all(key.startswith("module.") for key in state)
    if parallel:
        stripped = {key.removeprefix("module."): value for key, value in state.items()}
        if set(stripped) == expected:
            log.info("model.weights: removed the 'module.' prefix that nn.DataParallel adds")
            return stripped
    said = []
    for label, keys in (("missing", expected - set(state)), ("unexpected", set(state) - expected)):
        if keys:
            first = sorted(keys)[:3]
            more = f" (and {len(keys) - 3} more)" if len(keys) > 3 else ""
            said.append(f"{label} keys {', '.join(first)}{more}")
    hint = ("; its keys start with 'module.' (saved from nn.DataParallel) but do not match even "
            "without it" if parallel else "")
    raise ConfigError(f"model.weights={str(path)!r} is not a state_dict of this model: "
                      f"{'; '.join(said)}{hint}")


def _unreadable(path: Path, err: Exception) -> ProbeError:
    # torch's own message advises weights_only=False, which would run code from the file
    text = str(err)
    if "Unsupported global" in text:
        found = text.split("GLOBAL", 1)[1].split()[0] if "GLOBAL" in text else "an object"
        return ConfigError(
            f"model.weights={str(path)!r} holds a pickled {found}, not a state_dict; save one "
            "with torch.save(model.state_dict(), path) (probe loads checkpoints with "
            "weights_only=True and never runs code from them)")
    with path.open("rb") as stream:
        start = stream.read(8)
    if not start.startswith((b"PK\x03\x04", b"\x80")):  # neither a zip archive nor a pickle
        return DataError(f"model.weights={str(path)!r} is not a torch checkpoint (torch.save "
                         f"writes a zip archive; this file starts with {start!r}); pass the "
                         "file that torch.save(model.state_dict(), path) wrote")
    lines = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
    reason = lines[0].split(". This is")[0].split(":", 1)[-1].strip() if lines else ""
    reason = reason or type(err).__name__
    return DataError(f"model.weights={str(path)!r} cannot be read as a torch checkpoint "
                     f"({reason}); it may be corrupt or truncated: save it again with "
                     "torch.save(model.state_dict(), path)")


def looks_like_path(weights: str) -> bool:
    """Whether a ``model.weights`` value names a file rather than a library's weights."""
    text = str(weights)
    return "/" in text or text.startswith(".") or text.endswith((".pt", ".pth", ".ckpt", ".bin"))
