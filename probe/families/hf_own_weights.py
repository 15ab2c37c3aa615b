"""Attention patterns of Hugging Face attention modules that compute their own weights (BLOOM,
MPT, GPT-Neo, XGLM, DeBERTa-v2, ...) instead of calling transformers' attention interface,
which probe.families.hf_attention serves: such a module's weights are taken from its own
return value, as the model computes them.

    with own_weights(hooked, on_pattern, seen) as calls:
        model(**inputs)        # on_pattern(name, weights (B, heads, queries, keys))

The weights are the element of the module's return value that transformers' own recorder
reads for its class (``_can_record_outputs``), else element 1 (the (output, weights)
convention). A module that returns them only when asked (DeBERTa-v2: an ``if`` on
``output_attentions`` in its forward, or one beneath it) is asked, and its caller gets None in
their place again where it had not asked, so that it sees what it would have seen. A module
whose call the attention interface served (``calls[name][-1]["given"]``) is left to it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

__all__ = ["own_weights", "recorded_index"]

_ASKS = "output_attentions"
# a forward that returns its weights only when asked tests the flag
_ASKED_IN = re.compile(r"\bif\b[^\n]*\boutput_attentions\b|\boutput_attentions\s+(and|or)\b")


@contextmanager
def own_weights(hooked: Mapping[nn.Module, str], on_pattern: Callable[[str, torch.Tensor], None],
                seen: dict[str, tuple[int, int, int]], indices: Mapping[nn.Module, int]
                ) -> Iterator[dict[str, list[dict]]]:
    """For the block, each call of a ``hooked`` module (module -> name) that the attention
    interface did not serve gives ``on_pattern(name, weights)`` from its return value (at
    ``indices[module]``), and ``seen[name]`` its (heads, queries, keys); yields the calls under
    way by name, which the interface marks ``given``. A module whose return value holds no
    weights there gives nothing (the capture kind refuses it)."""
    calls: dict[str, list[dict]] = {name: [] for name in hooked.values()}
    with ExitStack() as hooks:
        for module, name in hooked.items():
            at = _position(module) if _gated(module) else None
            hooks.callback(module.register_forward_pre_hook(
                _before(calls[name], at), with_kwargs=True).remove)
            hooks.callback(module.register_forward_hook(
                _after(name, indices.get(module, 1), calls[name], on_pattern, seen)).remove)
        yield calls


def _before(calls: list[dict], at: int | None):
    def hook(module, args, kwargs):
        asked = True
        if at is not None and at < len(args):  # asked by position
            asked, args = bool(args[at]), (*args[:at], True, *args[at + 1:])
        elif at is not None:
            asked, kwargs = bool(kwargs.get(_ASKS, False)), {**kwargs, _ASKS: True}
        calls.append({"asked": asked, "given": False})
        return args, kwargs
    return hook


def _after(name: str, index: int, calls: list[dict], on_pattern, seen):
    def hook(module, args, output):
        call = calls.pop()
        if call["given"]:  # the attention interface gave them
            return None
        weights = output[index] if isinstance(output, tuple) and \
            -len(output) <= index < len(output) else None
        if not (isinstance(weights, torch.Tensor) and weights.dim() == 4):
            return None  # no attention module: the capture kind refuses it, naming those
        seen.setdefault(name, tuple(int(d) for d in weights.shape[1:]))
        if on_pattern is not None:
            on_pattern(name, weights)
        if not call["asked"]:  # its caller sees what it would have seen
            at = index % len(output)
            return (*output[:at], None, *output[at + 1:])
        return None
    return hook


def _gated(module: nn.Module) -> bool:
    """Whether the module, or one it holds, returns its weights only when asked."""
    return _position(module) is not None and any(_asks(type(m)) for m in module.modules())


@functools.cache
def _asks(cls: type) -> bool:
    try:
        return bool(_ASKED_IN.search(inspect.getsource(cls.forward)))
    except (OSError, TypeError):
        return False


def _position(module: nn.Module) -> int | None:
    """Where ``output_attentions`` stands among the forward's positional arguments (a large
    number where it is keyword-only); None where the forward does not name it."""
    parameters = list(inspect.signature(module.forward).parameters.values())
    for n, parameter in enumerate(parameters):
        if parameter.name == _ASKS:
            return n if parameter.kind is parameter.POSITIONAL_OR_KEYWORD else len(parameters)
    return None


def recorded_index(model: nn.Module, module: nn.Module, name: str) -> int:
    """The element of ``module``'s return value that transformers' own recorder reads as its
    attention weights (``_can_record_outputs`` of the nearest model holding it), else 1."""
    from transformers.modeling_utils import PreTrainedModel
    from transformers.utils.output_capturing import OutputRecorder

    owners = sorted(((n, m) for n, m in model.named_modules()
                     if isinstance(m, PreTrainedModel) and (not n or name.startswith(n + "."))),
                    key=lambda owner: -len(owner[0]))
    dotted = "." + name
    for _, owner in owners:
        for key, specs in (getattr(owner, "_can_record_outputs", None) or {}).items():
            if "attentions" not in key:
                continue
            for spec in specs if isinstance(specs, list) else [specs]:
                if not isinstance(spec, OutputRecorder):
                    named = isinstance(spec, str)
                    spec = OutputRecorder(target_class=None if named else spec, index=1,
                                          class_name=spec if named else None)
                matches = ((spec.target_class is not None and isinstance(module,
                                                                         spec.target_class))
                           or (spec.class_name is not None and dotted.endswith(spec.class_name)))
                if matches and (spec.layer_name is None or
                                f".{spec.layer_name.strip('.')}." in dotted + "."):
                    return spec.index
    return 1
