"""The per-run checks of the standard names (probe.families.names) of a Hugging Face model,
made on the dry run's sample before the first write, in one forward pass of their own:

- names: each standard name the run hooks resolved to one module of the model;
- blocks: each block of a stack the run names gives what the model's own
  ``output_hidden_states`` holds at its depth (HF's convention: hidden_states[0] is the
  embedding output, hidden_states[k] the output of block k - 1), the last block's output
  being hidden_states[-1] itself or, where the model applies its final norm there (GPT-2,
  Llama, ...), that norm's input;
- final_norm: the norm takes the last block's output;
- attention: the patterns of the hooked attention modules sum to 1 over the keys of each
  query (at most 1 where the module has attention sinks).

Each verdict is a line for the file's attrs; a check that fails stops the run in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack

import torch
from torch import nn

from probe.errors import ConfigError
from probe.families.base import first_tensor
from probe.families.hf_attention import eager_patterns
from probe.families.hf_names import hf_names
from probe.families.hf_seq2seq import with_decoder_start
from probe.families.names import StandardNames

__all__ = ["verify_run", "verify_names"]

# a block's output and the hidden state of its depth are the same computation
_RTOL, _ATOL = 1e-5, 1e-6
_HIDDEN = {"": "hidden_states", "encoder": "encoder_hidden_states",
           "decoder": "decoder_hidden_states"}


def verify_run(model: nn.Module, batch, hooked: Mapping[str, str],
               attention: bool) -> dict[str, str]:
    """``Checks.verify`` of the Hugging Face families (probe.families.base)."""
    inputs = batch.inputs if isinstance(batch.inputs, Mapping) else {
        model.main_input_name: batch.inputs}
    return verify_names(model, hf_names(model), inputs, hooked,
                        eager_patterns if attention else None)


def verify_names(model: nn.Module, names: StandardNames, inputs, hooked: Mapping[str, str],
                 patterns=None) -> dict[str, str]:
    """The verdicts of the checks on ``hooked`` (standard name -> module path) for a forward
    pass of ``model`` on ``inputs`` (a dict of the batch's inputs); ``patterns``: the
    family's ``patterns``, where the run stores attention patterns.

    Raises:
        ConfigError: a check that fails.
    """
    standard = {name: path for name, path in hooked.items() if name != path}
    if not standard:
        return {}
    modules = dict(model.named_modules())
    verdicts = {"names": _names(names, standard, modules)}
    stacks = {_stack_of(name) for name in standard}
    seen: dict[str, torch.Tensor] = {}
    weights: dict[str, torch.Tensor] = {}
    with ExitStack() as hooks:
        for prefix in stacks:
            stack = names.stacks[prefix]
            for path in (*stack.blocks, stack.singles.get("final_norm")):
                if path is not None:
                    hooks.callback(modules[path].register_forward_hook(
                        _keep(seen, path)).remove)
                    hooks.callback(modules[path].register_forward_pre_hook(
                        _keep(seen, path + ":in")).remove)
        attention = {modules[path]: name for name, path in standard.items()
                     if name.endswith(".attention")} if patterns is not None else {}
        if attention:
            hooks.enter_context(patterns(model, attention, lambda name, w: weights.setdefault(
                name, w.detach().float())))
        with torch.inference_mode():
            output = model(**with_decoder_start(model, dict(inputs)), output_hidden_states=True)
    for prefix in sorted(stacks):
        verdicts.update(_blocks(names, prefix, output, seen))
    if attention:
        verdicts["attention"] = _attention(names, weights, inputs, attention, modules)
    return verdicts


def _stack_of(name: str) -> str:
    head = name.split(".", 1)[0]
    return head if head in ("encoder", "decoder", "vision") else ""


def _keep(seen: dict, key: str):
    def hook(module, args, output=None):
        value, _ = first_tensor(args if output is None else output)
        if value is not None and key not in seen:
            seen[key] = value.detach().float()
    return hook


def _fail(names: StandardNames, check: str, detail: str) -> ConfigError:
    return ConfigError(f"verify: {names.architecture}'s {check} does not hold: {detail}; its "
                       "standard names are read wrongly here (report it): name its modules by "
                       "path, or set verify=false to run anyway")


def _names(names: StandardNames, standard: Mapping[str, str],
           modules: Mapping[str, nn.Module]) -> str:
    for name, path in standard.items():
        module = modules.get(path)
        if module is None:
            raise _fail(names, "names", f"{name} resolved to {path}, which is no module")
        twins = [other for other, m in modules.items() if m is module and other != path]
        if twins:
            raise _fail(names, "names", f"{name} resolved to {path}, also named {twins[0]}")
    return f"pass: each of the {len(standard)} standard names is one module"


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None or a.shape != b.shape:
        return False
    scale = float(b.abs().max()) if b.numel() else 0.0
    return torch.allclose(a, b, rtol=_RTOL, atol=_ATOL * max(scale, 1.0))


def _blocks(names: StandardNames, prefix: str, output, seen: dict) -> dict[str, str]:
    """The verdicts of a stack's blocks and final norm against the model's hidden states."""
    stack = names.stacks[prefix]
    head = f"{prefix}." if prefix else ""
    states = getattr(output, _HIDDEN.get(prefix, ""), None)
    if states is None:
        return {f"{head}blocks": "not checked: the model's output has no hidden states of "
                                 f"its {prefix or 'stack'}"}
    depth = len(stack.blocks)
    if len(states) != depth + 1:
        raise _fail(names, f"{head}blocks", f"{depth} blocks, but output_hidden_states has "
                    f"{len(states)} states (the embeddings' and one per block)")
    # hidden_states[k] is block k - 1's output (after the embeddings' own), or, where the
    # model records each block's output alone (Mamba), block k's
    offset = next((offset for offset in (1, 0) if all(
        _same(seen.get(path), states[n + offset].float())
        for n, path in enumerate(stack.blocks[:-1]))), None)
    if offset is None:
        n = next(n for n, path in enumerate(stack.blocks[:-1])
                 if not _same(seen.get(path), states[n + 1].float()))
        raise _fail(names, f"{head}blocks", f"{head}blocks.{n} ({stack.blocks[n]})'s output "
                    f"is not hidden_states[{n + 1}]")
    verdicts = {}
    last, final = seen.get(stack.blocks[-1]), states[-1].float()
    norm = stack.singles.get("final_norm")
    normed = norm is not None and _same(seen.get(norm), final)
    if _same(last, final):
        said = f"the last, hidden_states[{depth}] itself"
    elif normed and _same(seen.get(norm + ":in"), last):
        said = f"the last, hidden_states[{depth}] before {head}final_norm"
    else:
        raise _fail(names, f"{head}blocks", f"the last block ({stack.blocks[-1]})'s output is "
                    f"neither hidden_states[{depth}] nor {head}final_norm's input")
    first = f"hidden_states[{offset}-{depth - 2 + offset}]"
    verdicts[f"{head}blocks"] = (f"pass: blocks.0-{depth - 2} are {first}; {said}"
                                 if depth > 1 else f"pass: {said}")
    if norm is not None:
        if not _same(seen.get(norm + ":in"), last):
            raise _fail(names, f"{head}final_norm", f"{norm} does not take the last block's "
                        "output")
        verdicts[f"{head}final_norm"] = "pass: it takes the last block's output"
    return verdicts


def _attention(names: StandardNames, weights: dict[str, torch.Tensor], inputs,
               hooked: Mapping[nn.Module, str], modules: Mapping[str, nn.Module]) -> str:
    mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
    for module, name in hooked.items():
        pattern = weights.get(name)
        if pattern is None:
            return f"not checked: {name} gave no pattern"
        sums = pattern.sum(-1)  # (B, heads, queries)
        if mask is not None and mask.shape[-1] == sums.shape[-1]:
            sums = sums[mask.to(sums.device)[:, None, :].expand_as(sums).bool()]
        sinks = hasattr(module, "sinks")
        ok = (sums <= 1 + 1e-4).all() if sinks else torch.allclose(sums, torch.ones_like(sums),
                                                                      atol=1e-4)
        if not ok:
            raise _fail(names, "attention", f"{name}'s rows sum to {float(sums.min()):.4f}-"
                        f"{float(sums.max()):.4f}, not 1, over a query's keys")
    return (f"pass: {len(hooked)} modules' rows sum to 1 over a query's keys"
            + (" (at most 1: attention sinks)" if any(hasattr(m, "sinks") for m in hooked)
               else ""))
