"""The model and the dataset a config names, through ``hydra.utils.instantiate``.

A config's ``model`` and ``dataset`` nodes each name a ``_target_`` (a model family's builder,
probe.families, or a dataset); a ProbeError raised while building (an unknown model name, a
missing folder) reaches the user as it is, anything else becomes a ConfigError that names the
node.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from probe.errors import ConfigError, ProbeError
from probe.families.base import Preprocesses
from probe.families.registry import family_for

__all__ = ["build_model", "build_dataset"]


def build_model(cfg: DictConfig) -> nn.Module:
    """The config's model in eval mode, on the CPU, its random init seeded by ``cfg.seed``.

    Raises:
        ConfigError: a model config that cannot be built, or that builds no nn.Module.
    """
    torch.manual_seed(int(cfg.seed))
    model = _instantiate(cfg.model, "model")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: {cfg.model._target_} returned {type(model).__name__}, "
                          "not a torch.nn.Module")
    return model.eval()


def build_dataset(cfg: DictConfig) -> Dataset:
    """The config's dataset. With ``dataset.transform=auto``, a model whose family has its own
    evaluation preprocessing (named torchvision weights, timm) gives the dataset that
    transform, and with ``dataset.tokenizer=auto`` its text tokenizer (image-text pairs).
    ``dataset.on_error`` is probe's (how the loader treats a bad sample), not the
    dataset's: it is left out of the dataset's arguments.

    Raises:
        ConfigError: a dataset config that cannot be built.
    """
    node = cfg.dataset
    if "on_error" in node:  # resolved first: its interpolations point into the whole config
        values = OmegaConf.to_container(node, resolve=True)
        node = OmegaConf.create({k: v for k, v in values.items() if k != "on_error"})
    own = {}  # what the model's family gives for the keys set to auto
    auto = {key for key in ("transform", "tokenizer") if str(node.get(key, "")) == "auto"}
    if auto:
        family: Preprocesses = family_for(cfg.model)
        made = {"transform": family.transform(cfg.model) if "transform" in auto else None,
                "tokenizer": family.tokenizer(cfg.model) if "tokenizer" in auto else None}
        own = {key: value for key, value in made.items() if value is not None}
    return _instantiate(node, "dataset", **own)


def _instantiate(node: DictConfig, what: str, **kwargs):
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    missing = [k for k in node if OmegaConf.is_missing(node, k)]
    if missing:
        raise ConfigError(f"{what}.{missing[0]} is not set: add {what}.{missing[0]}=<value>")
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ProbeError):
            raise cause from None
        target = node.get("_target_")
        if str(err).startswith("Error locating target"):
            root = cause.__cause__ if cause is not None and cause.__cause__ else cause
            raise ConfigError(
                f"{what}._target_={target!r} cannot be imported ({_first_line(root)}); install "
                "the package that defines it (pip install -e path/to/it), or put the folder "
                "that contains it on PYTHONPATH"
            ) from None
        raise ConfigError(f"cannot build the {what} {target}: "
                          f"{_first_line(cause if cause is not None else err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {line}" if line else type(err).__name__
