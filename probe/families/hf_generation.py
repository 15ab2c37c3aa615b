"""What the Hugging Face families that generate text share (probe.families.transformers for
language models, probe.families.hf_vlm for vision-language models): generation with the hooks
on, every position seen once, and the objectives of next-token logits.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from probe.config.schema import GenerateConfig
from probe.data.feed import IGNORED_TARGET
from probe.errors import ConfigError
from probe.families.base import Answers

__all__ = ["generate", "generate_options", "new_tokens", "nll", "top1"]


def generate(model: nn.Module, inputs: dict, settings: GenerateConfig,
             all_logits: bool = False) -> Answers:
    """``FeedsAndReads.generate`` of a Hugging Face model that generates text (its own
    ``generate()``, with its key/value cache): see probe.families.base.

    Raises:
        ConfigError: the model has no language-model head.
    """
    if not (hasattr(model, "can_generate") and model.can_generate()):
        raise ConfigError(
            f"generate.max_new_tokens={settings.max_new_tokens}: {type(model).__name__} has "
            "no language-model head to generate with; use model.head=causal_lm (or auto "
            "where the checkpoint is a causal language model)")
    options, ends = generate_options(model, settings)
    accepts = inspect.signature(model.forward).parameters
    if all_logits and "logits_to_keep" in accepts:
        options["logits_to_keep"] = 0  # every position's, as a forward over them gives
    out = model.generate(**inputs, **options)
    sequences, prompt = out.sequences, inputs["input_ids"].shape[1]
    if out.cache.get_seq_length() < sequences.shape[1]:  # the last token was never fed
        _feed_last_token(model, sequences, inputs["attention_mask"], out.cache, accepts)
    return Answers(sequences, new_tokens(sequences[:, prompt:], ends))


def generate_options(model: nn.Module, settings: GenerateConfig) -> tuple[dict, list[int]]:
    """The options of the model's ``generate()`` that ``settings`` ask for, and the end tokens
    that stop an answer (none where ``stop_at_eos`` is off)."""
    config = model.generation_config
    ends = _ids(config.eos_token_id) if settings.stop_at_eos else []
    pad = config.pad_token_id if config.pad_token_id is not None else (ends or [0])[0]
    options = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.do_sample,
               "eos_token_id": ends or None, "pad_token_id": pad, "use_cache": True,
               "return_dict_in_generate": True}
    if settings.do_sample:
        options.update({key: getattr(settings, key) for key in ("temperature", "top_p")
                        if getattr(settings, key) is not None})
    return options, ends


def _ids(value) -> list[int]:
    # a generation config's token ids: one, a list, or none
    return [] if value is None else [int(value)] if isinstance(value, int) else list(value)


def _feed_last_token(model: nn.Module, sequences: torch.Tensor, prompt_mask: torch.Tensor,
                     cache, accepts) -> None:
    """One more step, as generate() would take it, on the last new token: its logits are
    dropped, its hooks' values are the token's own (positions counted as generate counts
    them under left padding)."""
    new = sequences.shape[1] - prompt_mask.shape[1]
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(len(prompt_mask), new)], 1)
    extra = {"use_cache": True}
    if "position_ids" in accepts:
        extra["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)
    if "logits_to_keep" in accepts:
        extra["logits_to_keep"] = 1
    model(**model.prepare_inputs_for_generation(
        sequences, next_sequence_length=1, cache=cache, attention_mask=mask, **extra),
        return_dict=True)


def new_tokens(new: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """Each sample's count of new tokens: up to and with its first end token, else all."""
    if not ends or not new.shape[1]:
        return torch.full((len(new),), new.shape[1], dtype=torch.long, device=new.device)
    ended = torch.isin(new, torch.tensor(ends, device=new.device))
    first = ended.int().argmax(1)
    return torch.where(ended.any(1), first + 1, new.shape[1])


def nll(logits: torch.Tensor, batch) -> torch.Tensor:
    """Each sample's mean next-token negative log-likelihood over its real tokens (0 for a
    sample of one token, which predicts nothing); of an encoder-decoder fed a target, over the
    target's tokens, which its decoder's logits predict position by position."""
    labels = batch.inputs.get("labels")
    if labels is not None:
        counted = (labels != IGNORED_TARGET).float()  # a target's padding
        losses = nn.functional.cross_entropy(logits.transpose(1, 2).float(),
                                             labels.clamp_min(0), reduction="none")
        return (losses * counted).sum(1) / counted.sum(1).clamp_min(1)
    ids = batch.inputs["input_ids"][:, 1:]
    mask = batch.inputs["attention_mask"]
    counted = (mask[:, 1:] * mask[:, :-1]).float()  # predictions from a real token of a real one
    losses = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), ids,
                                         reduction="none")
    return (losses * counted).sum(1) / counted.sum(1).clamp_min(1)


def top1(logits: torch.Tensor, batch) -> torch.Tensor:
    """The largest logit: at each sample's last real token, or of a classification head."""
    if logits.dim() == 3:
        last = batch.inputs["attention_mask"].sum(1) - 1
        logits = logits[torch.arange(len(logits), device=logits.device), last]
    return logits.amax(1)
