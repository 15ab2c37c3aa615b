"""Attention patterns of Hugging Face models, which sdpa and flash attention never materialise:
the hooked attention modules alone run their own eager attention and hand over its
post-softmax weights; every other module keeps its implementation.

    with eager_patterns(model, {module: "transformer.h.3.attn"}, on_pattern) as seen:
        model(**inputs)       # on_pattern("transformer.h.3.attn", weights (B, heads, Lq, Lk))
    seen                      # every module that computed attention -> (heads, Lq, Lk)

It goes through transformers' own attention interface: an implementation registered once,
``probe:sdpa`` (or ``probe:eager``), with the masks of the one it stands for, is set on the
model's configs for the block (and the configs are restored after). Called by a module, it runs
that module's own ``eager_attention_forward`` (from the module's modeling file) if the module is
hooked, else the implementation it stands for, unchanged. Masks come as that implementation
makes them; the eager path gets them as eager attention expects (additive, causal where the
module is).

A hooked module that computes its own weights instead of calling the interface (BLOOM, MPT,
GPT-Neo, XGLM, DeBERTa-v2) hands over those it returns (probe.families.hf_own_weights).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from probe.errors import ConfigError
from probe.families.hf_own_weights import own_weights, recorded_index

__all__ = ["eager_patterns", "PATTERNS_OF"]

_STANDS_FOR = ("sdpa", "eager")  # what a probe:<name> implementation stands for
PATTERNS_OF = "probe:"  # the prefix of the implementations registered here


@dataclass
class _Active:
    hooked: Mapping[nn.Module, str]
    on_pattern: Callable[[str, torch.Tensor], None] | None
    names: dict[nn.Module, str]
    seen: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # the calls of hooked modules under way, by name (probe.families.hf_own_weights)
    calls: dict[str, list[dict]] = field(default_factory=dict)


_ACTIVE: ContextVar[_Active | None] = ContextVar("probe_attention_patterns", default=None)
_registered: set[str] = set()


@contextmanager
def eager_patterns(model: nn.Module, hooked: Mapping[nn.Module, str],
                   on_pattern: Callable[[str, torch.Tensor], None] | None = None
                   ) -> Iterator[dict[str, tuple[int, int, int]]]:
    """For the block, ``hooked`` modules (module -> its name) run eager attention and give
    ``on_pattern(name, weights)``; yields the modules that computed attention, as the block
    runs (name -> heads, queries, keys of its first call).

    Raises:
        ConfigError: a config of the model whose attention implementation is neither sdpa nor
            eager (flash attention has no eager twin here).
    """
    configs = list({id(c): c for c in _configs(model)}.values())
    saved = [c._attn_implementation for c in configs]
    for implementation in saved:
        implementation = implementation or "eager"
        if implementation not in _STANDS_FOR:
            raise ConfigError(
                f"hooks=[attention] on a model with attn_implementation={implementation!r}: "
                "its patterns are never made; load it with sdpa or eager attention")
        _register(implementation)
    active = _Active(hooked, on_pattern, {m: n for n, m in model.named_modules()})
    indices = {module: recorded_index(model, module, active.names.get(module, ""))
               for module in hooked}
    token = _ACTIVE.set(active)
    try:
        for config, implementation in zip(configs, saved, strict=True):
            config._attn_implementation_internal = PATTERNS_OF + (implementation or "eager")
        with own_weights(hooked, on_pattern, active.seen, indices) as calls:
            active.calls = calls
            yield active.seen
    finally:
        for config, implementation in zip(configs, saved, strict=True):
            config._attn_implementation_internal = implementation
        _ACTIVE.reset(token)


def _configs(model: nn.Module):
    # every config a module of the model reads its attention implementation from, with the
    # sub-configs of composite ones (a two-tower model's text and vision configs)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            yield config
            for key in getattr(config, "sub_configs", {}) or {}:
                sub = getattr(config, key, None)
                if sub is not None and hasattr(sub, "_attn_implementation_internal"):
                    yield sub


def _register(implementation: str) -> None:
    """``probe:<implementation>``, once per process, with the masks of ``implementation``."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    name = PATTERNS_OF + implementation
    if name in _registered:
        return
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    AttentionInterface.register(name, _dispatch(implementation))
    _registered.add(name)


def _dispatch(implementation: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        active = _ACTIVE.get()
        if active is not None:
            name = active.names.get(module, type(module).__name__)
            active.seen.setdefault(name, (int(query.shape[1]), int(query.shape[2]),
                                          int(key.shape[2])))
        if active is None or module not in active.hooked:  # as the model would compute it
            own = (_own_eager(module) if implementation == "eager" else
                   ALL_ATTENTION_FUNCTIONS[implementation])
            return own(module, query, key, value, attention_mask, *args, **kwargs)
        mask = _additive(attention_mask, module, query, key, kwargs.get("is_causal"))
        output, weights = _own_eager(module)(module, query, key, value, mask, *args, **kwargs)
        for name in {active.hooked[module], active.names.get(module)}:
            if active.calls.get(name):  # served here: the module's own weights are not asked
                active.calls[name][-1]["given"] = True
        if active.on_pattern is not None:
            active.on_pattern(active.hooked[module], weights)
        return output, weights

    return attention


def _own_eager(module: nn.Module):
    own = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if own is None:
        raise ConfigError(f"{type(module).__name__} has no eager attention of its own "
                          "(eager_attention_forward) to take its patterns from")
    return own


def _additive(mask, module: nn.Module, query: torch.Tensor, key: torch.Tensor, is_causal):
    """An sdpa mask (None, or boolean: true where a query may attend) as eager attention takes
    it: added to the scores, the most negative value where a query may not attend. None, for
    a causal module, is sdpa's causal mask (the last query sees every key)."""
    if mask is not None and mask.dtype != torch.bool:
        return mask  # additive already (eager's own masks)
    queries, keys = query.shape[2], key.shape[2]
    if mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if not causal or queries == 1:
            return None
        steps = torch.arange(keys, device=query.device)
        mask = (steps[None] <= steps[keys - queries:, None]).view(1, 1, queries, keys)
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    return torch.where(mask, zero, torch.finfo(query.dtype).min)
