"""Where a Hugging Face attention module's heads are: the projection that joins them (its input
is every head's output side by side, head after head) and how many there are. Ablating head h
is changing the input's slice [h * size, (h + 1) * size) before that projection, which is what
transformers' own head masks did, and what TransformerLens' ``hook_z`` exposes.

    projection, count = attention_heads(model, "transformer.h.1.attn")
    # ("transformer.h.1.attn.c_proj", 2)
"""

from __future__ import annotations

from torch import nn

from probe.errors import ConfigError

__all__ = ["attention_heads"]

# the projection that joins the heads, by its name among the module's descendants, in the
# order tried: Llama, Mistral, Qwen, Gemma (o_proj); BART, CLIP, Whisper (out_proj); GPT-2
# (c_proj); BERT, ViT (output.dense); T5 (o); DistilBERT (out_lin); MPT, Falcon-like (out)
_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "output.dense", "o", "out_lin", "dense")
# where a module (or its config) says how many heads it has
_COUNTS = ("num_heads", "num_attention_heads", "n_head", "n_heads")


def attention_heads(model: nn.Module, name: str) -> tuple[str, int]:
    """The name of the projection that joins the heads of attention module ``name``, and
    their count.

    Raises:
        ConfigError: ``name`` is not an attention module whose heads can be found.
    """
    module = dict(model.named_modules())[name]
    children = dict(module.named_modules())
    projection = next((p for p in _PROJECTIONS if isinstance(children.get(p), nn.Module)
                       and _width(children[p]) is not None), None)
    count = _count(module)
    if projection is None or count is None:
        what = "no projection that joins heads" if projection is None else "no head count"
        raise ConfigError(f"{name!r} ({type(module).__name__}) has {what}; name the "
                          "attention module itself (e.g. transformer.h.1.attn, "
                          "model.layers.1.self_attn)")
    width = _width(children[projection])
    if width % count:
        raise ConfigError(f"the input of {name}.{projection} ({width} wide) is not {count} "
                          "heads side by side")
    return f"{name}.{projection}", count


def _width(module: nn.Module) -> int | None:
    # what a projection reads: Linear's in_features, GPT-2's Conv1D's nx
    for attribute in ("in_features", "nx"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _count(module: nn.Module) -> int | None:
    for part in module.modules():  # BERT keeps its count on the inner self-attention
        for attribute in _COUNTS:
            value = getattr(part, attribute, None)
            if isinstance(value, int) and value > 0:
                return value
    config = getattr(module, "config", None)
    for attribute in _COUNTS:
        value = getattr(config, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
