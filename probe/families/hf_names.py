"""The standard names (probe.families.names) of a Hugging Face model, found from the model's
own structure, the same way for every architecture:

- the stacks: an encoder-decoder's ``get_encoder()`` and ``get_decoder()``; a
  vision-language model's language model and vision tower; else the headless model;
- a stack's blocks: its largest list of modules (by parameters) that no other list holds;
- a block's attention: the innermost module whose class is an attention (``...Attention``),
  the cross-attention one where its path says so (``encoder_attn``, ``EncDecAttention``, ...);
- a block's mlp: the module the block calls ``mlp``, ``feed_forward``, ``ffn``,
  ``block_sparse_moe`` or ``DenseReluDense``, unless it adds the residual stream itself
  (BLOOM's, MPT's: its output is not the feed-forward's);
- embeddings: the stack's token embedding; final_norm: the norm beside the blocks, after them;
  lm_head: the output embedding of a model that generates.

An architecture that this reads wrongly gets its own reading with ``register_names``; the
per-run checks (probe.families.hf_verify) stop a run whose names do not hold.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace

from torch import nn

from probe.families.names import Stack, StandardNames

__all__ = ["hf_names", "register_names"]

_REGISTERED: dict[str, Callable[[nn.Module], StandardNames]] = {}
_CROSS = ("encoder_attn", "crossattention", "EncDecAttention", "cross_attn", "cross_attention")
_MLP = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "DenseReluDense")
_LANGUAGE = ("language_model",)
_VISION = ("vision_tower", "visual", "vision_model")
_SPLIT_MLP = ("its feed-forward is not one module of the block (two linear layers of the "
              "block, or an intermediate and an output module that adds the residual stream)")


def register_names(model_type: str, names: Callable[[nn.Module], StandardNames]) -> None:
    """Read the standard names of models of ``model_type`` (a config's ``model_type``) with
    ``names(model)`` instead of from their structure."""
    _REGISTERED[model_type] = names


def hf_names(model: nn.Module) -> StandardNames:
    """The standard names of a Hugging Face model (see the module's docstring)."""
    return _REGISTERED.get(_architecture(model), _read)(model)


def _architecture(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", None) or type(model).__name__)


def _read(model: nn.Module) -> StandardNames:
    """The standard names read from the model's structure."""
    architecture = _architecture(model)
    paths = _paths(model)
    roots = _roots(model, paths)
    if isinstance(roots, str):
        return StandardNames(architecture, refused=roots)
    stacks, notes = {}, {}
    for prefix, root in roots.items():
        found = _stack(model, root, paths, prefix, notes)
        if isinstance(found, str):
            return StandardNames(architecture, refused=found)
        stacks[prefix] = found
    return StandardNames(architecture, stacks, notes=notes)


def _paths(model: nn.Module) -> dict[int, str]:
    # each module's first name (a module shared by two parents, T5's embedding, has one)
    paths: dict[int, str] = {}
    for name, module in model.named_modules():
        paths.setdefault(id(module), name)
    return paths


def _roots(model: nn.Module, paths: dict[int, str]) -> dict[str, nn.Module] | str:
    """The model's stacks by prefix, or why it has no standard names."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
        return {"encoder": model.get_encoder(), "decoder": model.get_decoder()}
    named = {name.rsplit(".", 1)[-1]: module for name, module in model.named_modules() if name}
    vision = next((named[n] for n in _VISION if n in named), None)
    # a vision-language model generates with its language model (Idefics3 calls it
    # text_model); a two-tower model's text_model generates nothing
    generates = hasattr(model, "can_generate") and model.can_generate()
    language = next((named[n] for n in (*_LANGUAGE, *(("text_model",) if generates else ()))
                     if n in named), None)
    if language is not None:
        return {"": language, **({"vision": vision} if vision is not None else {})}
    if vision is not None and "text_model" in named:
        return (f"{type(model).__name__} has two towers, which have no standard names yet; "
                "name their modules by path (python -m probe.layers lists them)")
    return {"": getattr(model, "base_model", model)}


def _stack(model: nn.Module, root: nn.Module, paths: dict[int, str], prefix: str,
           notes: dict[str, str]) -> Stack | str:
    """One stack's names, or why it has none."""
    blocks = _blocks(root)
    what = f"{type(model).__name__}'s {prefix or 'stack'}"
    if blocks is None:
        return f"{what} has no list of blocks"
    depth = _depth(root, prefix)
    if depth is not None and depth != len(blocks):
        count = "one block module" if len(blocks) == 1 else f"{len(blocks)} block modules"
        return (f"{what} has {count} for its {depth} layers (it shares blocks over its "
                "depth); name its modules by path, whose calls are stored as output, output_1, "
                "...")
    parts: dict[str, list[str | None]] = {"attention": [], "cross_attention": [], "mlp": []}
    missing: dict[str, str] = {}
    for block in blocks:
        self_attention, cross = _attention(block)
        parts["attention"].append(self_attention and paths[id(self_attention)])
        parts["cross_attention"].append(cross and paths[id(cross)])
        mlp, why = _mlp(block)
        parts["mlp"].append(mlp and paths[id(mlp)])
        if why:
            missing["mlp"] = why
        for module in (self_attention, cross):
            if module is not None and _adds_residual(module):
                notes[paths[id(module)]] = (f"{type(module).__name__} adds the residual stream "
                                            "to its output")
    if not any(parts["attention"]):
        missing["attention"] = "its blocks compute no attention (state-space layers)"
    if not any(parts["cross_attention"]):
        missing["cross_attention"] = "its blocks have no cross-attention (only a decoder's do)"
    singles, reasons = _singles(model, root, blocks, paths, prefix)
    return Stack(tuple(paths[id(b)] for b in blocks),
                 {part: tuple(p) for part, p in parts.items()}, singles, {**missing, **reasons})


def _blocks(root: nn.Module) -> list[nn.Module] | None:
    lists = [m for m in root.modules() if isinstance(m, nn.ModuleList) and len(m)]
    inner = {id(sub) for m in lists for sub in m.modules() if sub is not m}
    outer = [m for m in lists if id(m) not in inner]
    if not outer:
        return None
    return list(max(outer, key=lambda m: sum(p.numel() for p in m.parameters())))


def _depth(root: nn.Module, prefix: str) -> int | None:
    # the layers the stack's config says it has, where it says so by a known key
    config = getattr(root, "config", None)
    if config is None:
        return None
    keys = {"encoder": ("encoder_layers", "num_layers"),
            "decoder": ("decoder_layers", "num_decoder_layers", "num_layers")}.get(
        prefix, ("num_hidden_layers", "n_layer", "num_layers"))
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def _attention(block: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """The block's innermost self-attention and cross-attention modules."""
    found: dict[bool, nn.Module] = {}
    named = [(name, m) for name, m in block.named_modules() if name and _is_attention(m)]
    for name, module in named:
        innermost = not any(other is not module and _is_attention(other)
                            for other in module.modules())
        cross = any(marker in name for marker in _CROSS)
        if innermost:
            found.setdefault(cross, module)
    return found.get(False), found.get(True)


def _is_attention(module: nn.Module) -> bool:
    name = type(module).__name__
    return "Attention" in name and not name.endswith("Output")


def _mlp(block: nn.Module) -> tuple[nn.Module | None, str]:
    """The block's feed-forward module, or None and why."""
    named = sorted(((name, m) for name, m in block.named_modules()
                    if name.rsplit(".", 1)[-1] in _MLP and name.count(".") <= 2),
                   key=lambda item: item[0].count("."))
    if not named:
        return None, _SPLIT_MLP
    module = named[0][1]
    if _adds_residual(module):
        return None, f"{type(module).__name__} adds the residual stream to its output"
    return module, ""


def _adds_residual(module: nn.Module) -> bool:
    return "residual" in inspect.signature(module.forward).parameters


def _singles(model: nn.Module, root: nn.Module, blocks: list[nn.Module],
             paths: dict[int, str], prefix: str
             ) -> tuple[dict[str, str | None], dict[str, str]]:
    singles: dict[str, str | None] = {}
    reasons: dict[str, str] = {}
    tokens = getattr(root, "embed_tokens", None)
    if tokens is None and prefix not in ("encoder", "decoder") and \
            hasattr(root, "get_input_embeddings"):
        try:
            tokens = root.get_input_embeddings()
        except NotImplementedError:
            tokens = None
    singles["embeddings"] = paths.get(id(tokens)) if isinstance(tokens, nn.Embedding) else None
    if singles["embeddings"] is None:
        reasons["embeddings"] = "its input is not token ids (a convolutional or patch stem)"
    singles["final_norm"] = _final_norm(root, blocks, paths)
    if singles["final_norm"] is None:
        reasons["final_norm"] = ("it has no norm after its last block (post-norm blocks end "
                                 "with their own)")
    generates = prefix in ("", "decoder") and hasattr(model, "can_generate") and \
        model.can_generate()
    head = model.get_output_embeddings() if generates else None
    singles["lm_head"] = paths.get(id(head)) if head is not None else None
    if singles["lm_head"] is None:
        reasons["lm_head"] = ("it has no next-token head (an encoder's, or a model built "
                              "without its head: model.head=causal_lm)")
    return singles, reasons


def _final_norm(root: nn.Module, blocks: list[nn.Module], paths: dict[int, str]) -> str | None:
    """The norm beside the blocks' list: registered after it, or named final or plain
    ``norm`` (OPT registers its final_layer_norm before its layers, T5Gemma its norm)."""
    listed = paths[id(blocks[0])].rsplit(".", 1)[0]
    parent_path, _, list_name = listed.rpartition(".")
    parent = next((m for m in root.modules() if paths.get(id(m)) == parent_path), None)
    if parent is None:
        return None
    after, named_final = False, None
    for name, child in parent.named_children():
        if name == list_name:
            after = True
        elif "Norm" in type(child).__name__ and not any(
                word in name.lower() for word in ("embed", "rel")):
            if after:
                return paths[id(child)]
            if "final" in name.lower() or name == "norm":
                named_final = paths[id(child)]
    return named_final


def _without_final_norm(why: str) -> Callable[[nn.Module], StandardNames]:
    """A reading of the structure that names no final norm, for ``why``."""
    def read(model: nn.Module) -> StandardNames:
        found = _read(model)
        stacks = {prefix: replace(stack, singles={**stack.singles, "final_norm": None},
                                  missing={**stack.missing, "final_norm": why})
                  for prefix, stack in found.stacks.items()}
        return replace(found, stacks=stacks)
    return read


# the architectures whose structure reads wrongly, each found by the per-run checks
register_names("deberta-v2", _without_final_norm(
    "its encoder's LayerNorm norms the relative-position embeddings, and its blocks end with "
    "their own norm"))
