"""The config, read once: ``read_config(cfg)`` checks every value that needs no model, data or
file, and gives the composed config as the schema's own typed object (``ProbeConfig``: enums as
members, nested sections as dataclasses), which the rest of the pipeline takes. A new key is one
field of the schema; a value with a range is one line here.
"""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from probe.config.schema import GenerateConfig, OutputConfig, ProbeConfig, ShardConfig
from probe.errors import ConfigError

__all__ = ["read_config", "check_known_keys", "required"]

_ON_ERROR = ("raise", "skip")


def read_config(cfg: DictConfig) -> ProbeConfig:
    """The typed config of a composed (or hand-made) ``cfg``; its ``model`` and ``dataset``
    stay the config's nodes, for Hydra to instantiate.

    Raises:
        ConfigError: a key that is not probe's, a value of the wrong type, or one that cannot
            work.
    """
    check_known_keys(cfg)
    values = OmegaConf.to_container(cfg, resolve=True)
    for group in ("model", "dataset"):  # instantiated by Hydra, as they are
        values.pop(group, None)
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(
            OmegaConf.structured(ProbeConfig(model=None, dataset=None)), values))
    except OmegaConfBaseException as err:
        raise ConfigError(str(err).strip().splitlines()[0]) from None
    typed.model, typed.dataset = cfg.get("model"), cfg.get("dataset")
    _check_values(typed)
    return typed


def _check_values(config: ProbeConfig) -> None:
    for key, value, least in (("batch_size", config.batch_size, 1),
                              ("num_workers", config.num_workers, 0),
                              ("output.commit_every", config.output.commit_every, 1)):
        if value < least:
            what = {"output.commit_every": " (batches between commits)"}.get(key, "")
            raise ConfigError(f"{key}={value} must be {'at least 1' if least else '0 or more'}"
                              f"{what}")
    if not config.output.commit_seconds > 0:
        raise ConfigError(f"output.commit_seconds={config.output.commit_seconds} must be more "
                          "than 0 (seconds between commits)")
    if config.batch_tokens is not None and config.batch_tokens < 1:
        raise ConfigError(f"batch_tokens={config.batch_tokens} must be at least 1, or null")
    on_error = str((config.dataset or {}).get("on_error", "raise"))
    if on_error not in _ON_ERROR:
        raise ConfigError(f"dataset.on_error={on_error!r}: use raise (stop at a sample that "
                          "cannot be loaded) or skip (leave it out, and record it in /skipped)")
    if not config.hooks:
        raise ConfigError("hooks is empty; use e.g. 'hooks=[forward]'")
    _check_generate(config.generate)


def _check_generate(generate: GenerateConfig) -> None:
    if generate.max_new_tokens < 0:
        raise ConfigError(f"generate.max_new_tokens={generate.max_new_tokens} must be 0 (no "
                          "generation) or more")
    for key in ("temperature", "top_p"):
        value = getattr(generate, key)
        if value is None:
            continue
        if not generate.do_sample:
            raise ConfigError(f"generate.{key}={value} shapes sampling, which is off; add "
                              "generate.do_sample=true, or leave it out for the most likely "
                              "tokens")
        if not value > 0 or (key == "top_p" and value > 1):
            bound = "in (0, 1]" if key == "top_p" else "more than 0"
            raise ConfigError(f"generate.{key}={value} must be {bound}")


def check_known_keys(cfg: DictConfig, schema: type = ProbeConfig, prefix: str = "") -> None:
    """Refuse keys the schema does not have. Hydra refuses them too, except when added with
    ``+``, which its own hint for a misspelled key suggests (``+batchsize=8``).

    Raises:
        ConfigError: naming the unknown key and the closest real one.
    """
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in cfg:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise ConfigError(f"{prefix}{key} is not a probe config key{hint} (python -m probe "
                              "--help lists them all)")
        kind = fields[str(key)].type
        nested = next((c for c in (ShardConfig, OutputConfig, GenerateConfig)
                       if kind in (c, c.__name__)), None)
        if nested is not None and isinstance(cfg[key], DictConfig):
            check_known_keys(cfg[key], nested, f"{prefix}{key}.")


def required(value, key: str, what: str = "PATH, the .h5 file a probe run wrote"):
    """``value``, the command's setting ``key``, which has no default.

    Raises:
        ConfigError: it is not set, saying what to pass (``what``).
    """
    if value is None:
        raise ConfigError(f"{key} is not set; pass {key}={what}")
    return value
