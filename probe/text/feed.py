"""How token sequences reach a Hugging Face model (the feed of probe.text.TextDataset).

Batches are right-padded, with an attention mask, so that position ids start at 0 for every
sample (GPT-2's absolute positions would shift under left padding); padding is never stored.
Every captured tensor whose leading axes are (batch, sequence) gives rows by ``tokens``: one per
stored token, or one per sample. Objectives:

    nll     each sample's mean next-token negative log-likelihood over its real tokens
    top1    the largest logit: at the last real token, or of a classification head
    target  the logit of the sample's label (sequence classification, with label_column)
    {_target_: mylab.objective}   any callable (model output, batch) -> one value per sample
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from probe.errors import ConfigError
from probe.feed import Batch, Batching, Objective, StreamSlice, batch_loader
from probe.format import DOCUMENT, INPUT_IDS, POSITIONS, DatasetSpec
from probe.text.batching import plan_batches
from probe.text.stream import stream_items

__all__ = ["TextFeed", "nll", "top1", "target"]


class TextFeed:
    """The feed of TextDataset: see the module's docstring."""

    unit = "tok"
    token_rows = True  # captures with a token axis give rows per token (tokens=all)
    hint = "a dataset.max_length beyond the model's positions?"

    def has_targets(self, dataset) -> bool:
        return dataset.label_column is not None

    def loader(self, dataset, indices: list[int] | StreamSlice, batching: Batching):
        """Batches over ``indices``: in dataset order, or bucketed by length within windows
        (each batch says whether it ends its window; probe.text.batching)."""
        if isinstance(indices, StreamSlice):
            yield from self._streamed(dataset, indices, batching)
            return
        planned = plan_batches(dataset.lengths(indices), batching)
        loader = batch_loader(_Rows(dataset, indices), self.collate,
                              num_workers=batching.num_workers, pin_memory=batching.pin_memory,
                              batch_sampler=[positions.tolist() for positions, _ in planned])
        for batch, (_, window_end) in zip(loader, planned, strict=True):
            batch.window_end = window_end
            yield batch

    def _streamed(self, dataset, selection: StreamSlice, batching: Batching):
        # the stream's samples a window at a time, cut into batches as from a list
        window = batching.window if batching.window > 1 else batching.batch_size
        rows: list[tuple[int, dict]] = []
        for row in stream_items(dataset, selection):
            rows.append(row)
            if len(rows) == window:
                yield from self._batches_of(rows, batching)
                rows = []
        yield from self._batches_of(rows, batching)

    def _batches_of(self, rows: list[tuple[int, dict]], batching: Batching):
        lengths = np.asarray([len(item["input_ids"]) for _, item in rows], dtype=np.int64)
        for positions, window_end in plan_batches(lengths, batching):
            batch = self.collate([rows[p] for p in positions])
            batch.window_end = window_end
            yield batch

    def dry_batches(self, dataset, index: int) -> list[Batch]:
        """The sample alone, and again one position shorter (or, for a sample of one token,
        one longer with padding): a captured tensor whose second axis follows the length is a
        token layout. Never longer than the sample, which may fill the model's positions."""
        row = _Rows(dataset, [index])[0]
        if len(row[1]["input_ids"]) < 2:
            return [self.collate([row]), self.collate([row], extra=1)]
        shorter = {key: value[:-1] if isinstance(value, torch.Tensor) else value
                   for key, value in row[1].items()}
        return [self.collate([row]), self.collate([(row[0], shorter)])]

    def collate(self, rows: list[tuple[int, dict]], extra: int = 0) -> Batch:
        index = torch.tensor([i for i, _ in rows], dtype=torch.int64)
        items = [item for _, item in rows]
        ids = pad_sequence([item["input_ids"] for item in items], batch_first=True)
        length = ids.shape[1] + extra
        ids = nn.functional.pad(ids, (0, extra))  # padding ids are masked: any will do
        real = torch.zeros(ids.shape, dtype=torch.bool)
        keep = torch.zeros(ids.shape, dtype=torch.bool)
        for n, item in enumerate(items):
            real[n, :len(item["input_ids"])] = True
            keep[n, :len(item["keep"])] = item["keep"]
        positions = torch.arange(length).expand(len(items), length)
        token_rows = {INPUT_IDS: ids[keep].to(torch.int32),
                      POSITIONS: positions[keep].to(torch.int32)}
        if items[0]["document"] is not None:
            token_rows[DOCUMENT] = torch.cat([item["document"][item["keep"]] for item in items])
        return Batch(index, torch.tensor([item["target"] for item in items], dtype=torch.int64),
                     {"input_ids": ids, "attention_mask": real.long()}, keep=keep,
                     token_rows=token_rows)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        """The model on the batch; with ``input_grad`` the autograd graph starts at the input
        embeddings (token ids have no gradient)."""
        handle = (model.get_input_embeddings().register_forward_hook(_start_graph)
                  if input_grad else None)
        try:
            return model(**batch.inputs)
        finally:
            if handle is not None:
                handle.remove()

    def objective(self, spec, model: nn.Module) -> tuple[Objective, str]:
        from probe.text.models import head_of

        head = head_of(model)
        if isinstance(spec, (dict, DictConfig)):
            from probe.objectives import make_objective

            function, name = make_objective(spec)
            return _checked(function), name
        named = {"nll": (nll, ("causal_lm",)), "top1": (top1, ("causal_lm", "masked_lm",
                                                                "sequence_classification")),
                 "target": (target, ("sequence_classification",))}
        if str(spec) not in named:
            raise ConfigError(f"objective={spec!r} is unknown for a language model; use nll, "
                              "top1, target, or a config with a _target_ callable (output, "
                              "batch) -> one value per sample")
        function, heads = named[str(spec)]
        if head not in heads:
            raise ConfigError(
                f"objective={spec} needs model.head={' or '.join(heads)}, but the model has "
                f"{'no head' if head == 'base' else f'head {head}'} ({type(model).__name__})"
            )
        return _checked(function), str(spec)

    def stored_tokens(self, dataset, indices: list[int] | StreamSlice) -> np.ndarray | None:
        """The token rows each sample stores (None for a stream: unknown before it is read)."""
        return None if isinstance(indices, StreamSlice) else dataset.stored_lengths(indices)

    def token_datasets(self, dataset) -> dict[str, DatasetSpec]:
        """The per-token bookkeeping a text run stores beside the layers."""
        specs = {INPUT_IDS: DatasetSpec((), "int32", compressible=False, per_token=True),
                 POSITIONS: DatasetSpec((), "int32", compressible=False, per_token=True)}
        if dataset.packing:
            specs[DOCUMENT] = DatasetSpec((), "int64", compressible=False, per_token=True)
        return specs

    def attrs(self, dataset) -> dict:
        return {"tokenizer": dataset.tokenizer_name, "max_length": dataset.max_length,
                "packing": dataset.packing, "exclude_special": dataset.exclude_special,
                "streaming": dataset.streaming,
                "truncated_documents": len(dataset.truncated)}

    def count(self, batch: Batch) -> int:
        return int(batch.keep.sum())

    def units(self, dataset, indices: list[int] | StreamSlice) -> int | None:
        if isinstance(indices, StreamSlice):
            return None
        return int(dataset.stored_lengths(indices).sum()) if indices else 0

    def describe(self, batch: Batch) -> str:
        return f"{batch.keep.shape[1]} tokens"


def nll(output, batch: Batch) -> torch.Tensor:
    """Each sample's mean next-token negative log-likelihood over its real tokens (0 for a
    sample of one token, which predicts nothing)."""
    logits, ids = _logits(output)[:, :-1], batch.inputs["input_ids"][:, 1:]
    mask = batch.inputs["attention_mask"]
    counted = (mask[:, 1:] * mask[:, :-1]).float()  # predictions from a real token of a real one
    losses = nn.functional.cross_entropy(logits.transpose(1, 2).float(), ids, reduction="none")
    return (losses * counted).sum(1) / counted.sum(1).clamp_min(1)


def top1(output, batch: Batch) -> torch.Tensor:
    """The largest logit: at each sample's last real token, or of a classification head."""
    logits = _logits(output)
    if logits.dim() == 3:
        last = batch.inputs["attention_mask"].sum(1) - 1
        logits = logits[torch.arange(len(logits), device=logits.device), last]
    return logits.amax(1)


def target(output, batch: Batch) -> torch.Tensor:
    """The logit of each sample's label, from a classification head."""
    logits = _logits(output)
    return logits.gather(1, batch.target.to(logits.device).view(-1, 1)).squeeze(1)


def _logits(output) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if logits is None:
        raise ConfigError("the model returns no logits (model.head=base?); use model.head="
                          "causal_lm, masked_lm or sequence_classification for gradients")
    return logits


def _checked(function: Callable) -> Objective:
    def objective(output, batch: Batch) -> torch.Tensor:
        values = function(output, batch)
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (len(batch),):
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values)
            raise ConfigError(f"the objective returned {got} for a batch of {len(batch)}; it "
                              f"must return one value per sample, shape ({len(batch)},)")
        return values
    return objective


def _start_graph(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    # a leaf that requires grad: every path from the input embeddings is then in the graph
    return output.detach().requires_grad_()


class _Rows:
    """The dataset seen through ``indices``, as (dataset index, item)."""

    def __init__(self, dataset, indices: list[int]):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, dict[str, Any]]:
        return self.indices[i], self.dataset[self.indices[i]]
