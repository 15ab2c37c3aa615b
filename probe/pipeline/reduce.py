"""Each layer's reduce, from the config: how a captured (N, C, ...) tensor is shrunk before it
is stored (probe.pipeline.keys applies it).

    reduce=mean | max       over the axes after the channel axis (a conv map's space)
    reduce=flatten          to (N, -1)
    reduce_by_layer         exceptions by layer name or glob: {layer4: none}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from probe.config.schema import Reduce, member
from probe.errors import ConfigError
from probe.pipeline.modules import match_layers

__all__ = ["resolve_reduces"]


def resolve_reduces(layers: Iterable[str], reduce: str | Reduce,
                    overrides: Mapping[str, str | Reduce] | None = None) -> dict[str, Reduce]:
    """Each layer's reduce: ``reduce``, unless ``overrides`` ({layer name or glob: reduce}) says
    otherwise. A layer's own name beats a glob, and globs that match one layer must agree, so
    the order of the keys never matters (the resume check compares configs without it).

    Raises:
        ConfigError: an unknown reduce, a key that matches none of ``layers``, or globs that
            give one layer different reduces.
    """
    layers = list(layers)
    default = _parse_reduce(reduce, "reduce")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"reduce_by_layer={overrides!r} is not a mapping; write it as "
                          "'reduce_by_layer={layer4:none}'")
    named = {str(key): _parse_reduce(how, f"reduce_by_layer.{key}")
             for key, how in (overrides or {}).items()}
    by_glob: dict[str, dict[str, Reduce]] = {}  # layer -> {glob that matches it: reduce}
    for pattern, how in named.items():
        hits = match_layers(layers, pattern)
        if not hits:
            shown = ", ".join(layers[:6]) + (f", ... ({len(layers)} in all)"
                                            if len(layers) > 6 else "")
            raise ConfigError(
                f"reduce_by_layer names {pattern!r}, which matches none of the layers "
                f"({shown}); use one of them, or a glob over them"
            )
        for layer in hits:
            if layer != pattern:
                by_glob.setdefault(layer, {})[pattern] = how
    reduces: dict[str, Reduce] = {}
    for layer in layers:
        globs = by_glob.get(layer, {})
        if layer not in named and len(set(globs.values())) > 1:
            said = ", ".join(f"{glob}: {how.name}" for glob, how in globs.items())
            raise ConfigError(
                f"reduce_by_layer gives {layer!r} different reduces ({said}); add the layer "
                f"itself, e.g. 'reduce_by_layer={{{layer}:none, ...}}', to decide"
            )
        reduces[layer] = named.get(layer, next(iter(globs.values()), default))
    return reduces


def _parse_reduce(value: str | Reduce, what: str) -> Reduce:
    if isinstance(value, Mapping):  # +reduce_by_layer.layer4.1=none nests at each dot
        raise ConfigError(
            f"{what} is a mapping, not a reduce; write layer names with dots inside braces: "
            "'reduce_by_layer={layer4.1:none}'"
        )
    return member(Reduce, value, f"{what}={value!r}")
