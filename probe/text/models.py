"""Hugging Face language models by name or folder: ``model=transformers model.name=gpt2``.

The model is built with transformers' own Auto classes, with the key/value cache off (nobody
needs it while probing) and in eval mode. ``weights=pretrained`` loads the weights with
``from_pretrained`` (the Hub cache, so it works offline once cached, and honours
``HF_HUB_OFFLINE``); ``weights=null`` initialises them from the model's config, seeded by
``seed``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError

__all__ = ["transformers_model", "head_of", "HEADS"]

log = logging.getLogger(__name__)

# model.head -> the Auto class that builds it
HEADS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
         "sequence_classification": "AutoModelForSequenceClassification", "base": "AutoModel"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def transformers_model(name: str, weights: str | None = "pretrained", head: str = "causal_lm",
                       dtype: str = "float32", trust_remote_code: bool = False,
                       device_map: str | dict | None = None,
                       offload_folder: str | None = None) -> nn.Module:
    """A transformers model in eval mode, its key/value cache off.

    Args:
        name: a Hub id (``gpt2``, ``meta-llama/Llama-3.2-1B``) or a folder saved with
            ``save_pretrained``.
        weights: ``pretrained`` (from_pretrained) or None (random init from the config).
        head: causal_lm, masked_lm, sequence_classification, or base (no head).
        dtype: float32, bfloat16 or float16.
        trust_remote_code: run the model's own code from the Hub (off unless set).
        device_map: ``auto`` spreads a model larger than one device over the GPUs of the node
            (then CPU memory), through accelerate, as ``from_pretrained`` does; or an explicit
            {module: device} map. None: the whole model on the run's ``device``.
        offload_folder: where a device map's ``disk`` modules keep their weights.

    Raises:
        ConfigError: an unknown head, dtype or weights value.
        DataError: a folder that does not exist, or a Hub id that is neither cached nor
            reachable (the message says how to make it available offline).
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()
    for key, value, allowed in (("head", head, HEADS), ("dtype", dtype, _DTYPES),
                                ("weights", weights, ("pretrained", None))):
        if value not in allowed:
            choices = ", ".join("null" if a is None else a for a in allowed)
            raise ConfigError(f"model.{key}={value!r} is unknown; use one of {choices}")
    source = _source(str(name))
    options = {"trust_remote_code": bool(trust_remote_code)}
    if device_map is not None:
        if weights != "pretrained":
            raise ConfigError("model.device_map places pretrained weights as they load; it needs "
                              "model.weights=pretrained")
        try:
            import accelerate  # noqa: F401  (from_pretrained places the model through it)
        except ImportError:
            raise ConfigError("model.device_map needs accelerate: pip install 'probe[text]'") \
                from None
    try:
        config = transformers.AutoConfig.from_pretrained(source, **options)
        auto = getattr(transformers, HEADS[head])
        if weights == "pretrained":
            model = auto.from_pretrained(source, config=config, dtype=_DTYPES[dtype],
                                         device_map=_plain(device_map),
                                         offload_folder=offload_folder, **options)
        else:
            model = auto.from_config(config, **options).to(_DTYPES[dtype])
    except OSError as err:
        raise _unavailable(str(name), source, err) from None
    except ValueError as err:  # a config that this Auto class cannot build
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"model.name={name!r} with model.head={head}: {first}") from None
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.eval()


def _plain(device_map):
    # a map given in the config arrives as a DictConfig; transformers wants a dict
    return dict(device_map) if hasattr(device_map, "items") else device_map


def head_of(model: nn.Module) -> str:
    """Which head a transformers model carries (one of HEADS), from its class name."""
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if name.endswith("ForMaskedLM"):
        return "masked_lm"
    if name.endswith("ForSequenceClassification"):
        return "sequence_classification"
    return "base"


def _source(name: str) -> str:
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise DataError(f"model.name={name!r} is a folder without config.json; pass a folder "
                            "that save_pretrained wrote, or a Hub id")
        return str(path)
    if name.startswith(("/", "./", "../", "~")):
        raise DataError(f"model.name={name!r}: no such folder; pass a folder that "
                        "save_pretrained wrote, or a Hub id such as gpt2")
    return name


def _unavailable(name: str, source: str, err: OSError) -> DataError:
    if Path(source).exists():
        first = str(err).strip().splitlines()[0]
        return DataError(f"model.name={name!r}: cannot load it ({first})")
    return DataError(
        f"model.name={name!r} is neither a folder nor in the Hugging Face cache, and the Hub "
        "could not be reached; to use it offline, download it once where there is a network "
        f"(huggingface-cli download {name}) and copy the cache (~/.cache/huggingface, or "
        "$HF_HOME) to this machine, or save it with save_pretrained and pass that folder as "
        "model.name (set HF_HUB_OFFLINE=1 to fail at once instead of retrying)"
    )
