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
# and how wide each head's output is (v_head_dim first: where a query's head differs from a
# value's, as in DeepSeek's attention, the projection reads the values')
_SIZES = ("v_head_dim", "head_dim", "attention_head_size", "head_size")


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
    carrier = _carrier(module)
    if projection is None or carrier is None:
        what = "no projection that joins heads" if projection is None else "no head count"
        raise ConfigError(f"{name!r} ({type(module).__name__}) has {what}; name the "
                          "attention module itself (e.g. transformer.h.1.attn, "
                          "model.layers.1.self_attn)")
    inside, count, size = carrier
    # a block holds an FFN whose output projection may share the name (BERT's output.dense):
    # the heads' projection lies in the attention part that says how many heads there are
    if inside and not projection.startswith(inside + "."):
        raise ConfigError(f"{name!r} ({type(module).__name__}): its {projection} does not "
                          f"join the heads of {name}.{inside}; name {name}.{inside}")
    width = _width(children[projection])
    if (width != count * size) if size else (width % count != 0):
        heads = f"{count} heads of {size}" if size else f"{count} heads"
        raise ConfigError(f"the input of {name}.{projection} ({width} wide) is not {heads} "
                          f"side by side; name the attention module whose heads it joins")
    return f"{name}.{projection}", count


def _width(module: nn.Module) -> int | None:
    # what a projection reads: Linear's in_features, GPT-2's Conv1D's nx
    for attribute in ("in_features", "nx"):
        value = getattr(module, attribute, None)
        if isinstance(value, int):
            return value
    return None


def _carrier(module: nn.Module) -> tuple[str, int, int | None] | None:
    """Where in ``module`` its heads are counted: the part that holds its projection ("" for
    the module itself), the count, and each head's width (None: not said)."""
    for part_name, part in module.named_modules():  # BERT counts on the inner self-attention
        count = _positive(part, _COUNTS)
        if count is not None:
            # BERT's attention.self sits beside attention.output, which holds the projection
            return part_name.rpartition(".")[0], count, _positive(part, _SIZES)
    count = _positive(getattr(module, "config", None), _COUNTS)
    return None if count is None else ("", count, _positive(module, _SIZES))


def _positive(holder, attributes: tuple[str, ...]) -> int | None:
    for attribute in attributes:
        value = getattr(holder, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
