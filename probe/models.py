"""Model construction: torchvision models by name, with random, named or local weights."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError, ProbeError

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
        model = _pretrained(tvm, name, _weights_enum(tvm, name, str(weights)), str(weights))
    return model.eval()


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


def _looks_like_path(weights: str) -> bool:
    text = str(weights)
    return "/" in text or text.startswith(".") or text.endswith((".pt", ".pth", ".ckpt", ".bin"))


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
