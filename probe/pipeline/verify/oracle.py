"""The model computed the plain way, one sample at a time and without padding: what each of
probe.verify's checks compares probe's rows with. Nothing of probe's runs here: hooks of its
own on the modules, transformers' own eager attention, torch.autograd.grad.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

__all__ = ["outputs_alone", "patterns_alone", "gradient_alone"]


def _inputs(model: nn.Module, ids: Sequence[int], read: Sequence[int] | None = None) -> dict:
    # an encoder-decoder's decoder reads ``read``, else its start token alone
    tensor = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]
    inputs = {"input_ids": tensor, "attention_mask": torch.ones_like(tensor)}
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        if read is None:
            start = getattr(config, "decoder_start_token_id", None)
            start = getattr(config, "pad_token_id", None) if start is None else start
            read = [int(start or 0)]
        inputs["decoder_input_ids"] = torch.as_tensor(np.asarray(read), dtype=torch.long)[None]
    return inputs


@contextmanager
def _kept(model: nn.Module, paths: Sequence[str], pick: Callable) -> Iterator[dict]:
    """For the block, what ``pick(output)`` gives of each module at ``paths`` (first call)."""
    modules = dict(model.named_modules())
    seen: dict[str, object] = {}

    def keep(path):
        def hook(module, args, output):
            seen.setdefault(path, pick(output))
        return hook

    handles = [modules[path].register_forward_hook(keep(path)) for path in paths]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _first(output):
    return output if isinstance(output, torch.Tensor) else next(
        item for item in output if isinstance(item, torch.Tensor))


def outputs_alone(model: nn.Module, ids: Sequence[int], paths: Sequence[str],
                  read: Sequence[int] | None = None
                  ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Each module's output (positions, ...) and the logits (positions, vocabulary) of one
    forward pass over ``ids`` alone (an encoder-decoder's decoder reading ``read``)."""
    with _kept(model, paths, _first) as seen, torch.no_grad():
        output = model(**_inputs(model, ids, read))
    logits = getattr(output, "logits", None)
    return ({path: value[0].float().numpy() for path, value in seen.items()},
            None if logits is None else logits[0].float().numpy())


def patterns_alone(model: nn.Module, ids: Sequence[int], encoder: bool = False
                   ) -> list[np.ndarray]:
    """The post-softmax weights (heads, queries, keys) of every attention module, in the
    order of the blocks (an encoder-decoder's encoder's with ``encoder``), as the model gives
    them with transformers' eager attention and ``output_attentions`` on ``ids`` alone; the
    model's implementation is restored after."""
    before = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            output = model(**_inputs(model, ids), output_attentions=True)
    finally:
        model.set_attn_implementation(before)
    found = getattr(output, "encoder_attentions" if encoder else "attentions", None) or ()
    return [weights[0].float().numpy() for weights in found]


def gradient_alone(model: nn.Module, ids: Sequence[int], path: str, objective: str,
                   target: Sequence[int] | None = None) -> np.ndarray:
    """d objective / d the output of the module at ``path`` (positions, ...), on ``ids``
    alone: ``nll``, the mean next-token loss (an encoder-decoder's: of its ``target``,
    teacher-forced); ``top1``, the largest logit at the last token."""
    read = None
    if target is not None:
        labels = torch.as_tensor(np.asarray(target), dtype=torch.long)[None]
        read = model.prepare_decoder_input_ids_from_labels(labels=labels)[0].tolist()
    with _kept(model, [path], _first) as seen, torch.enable_grad():
        logits = model(**_inputs(model, ids, read)).logits[0].float()
        if target is not None:
            value = nn.functional.cross_entropy(logits, torch.as_tensor(np.asarray(target)))
        else:
            targets = torch.as_tensor(np.asarray(ids), dtype=torch.long)
            value = (nn.functional.cross_entropy(logits[:-1], targets[1:])
                     if objective == "nll" else logits[-1].max())
        (grad,) = torch.autograd.grad(value, seen[path])
    return grad[0].float().numpy()
