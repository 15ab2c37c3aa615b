"""``python -m probe.layers model=...``: every module of the model, with the shape it outputs for
one sample (one token, for a language model) and the bytes that sample (token) adds to a file.
Writes nothing, not even a run folder."""

from __future__ import annotations

import math
import sys

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command

__all__ = ["main", "layer_table"]


def layer_table(cfg: DictConfig) -> list[tuple[str, str, str, str]]:
    """Rows of (name, type, output shape, bytes per sample or per token), a header first. For
    language models, an output with a token axis is shown per token.

    Raises:
        ProbeError: a model, dataset or reduce that cannot work.
    """
    import torch

    from probe.build import build_dataset, build_model
    from probe.config import option_name
    from probe.device import resolve_device
    from probe.feed import feed_for
    from probe.layers import describe_layers
    from probe.planner import TORCH_DTYPES
    from probe.reduce import reduce_tensor, resolve_reduces
    from probe.units import human_bytes

    device = resolve_device(cfg.device)
    model, dataset = build_model(cfg).to(device), build_dataset(cfg)
    feed = feed_for(dataset)
    batch = feed.dry_batches(dataset, 0)[0].to(device)
    length = batch.keep.shape[1] if feed.token_rows else None
    infos = describe_layers(model, lambda: feed.forward(model, batch))
    reduces = resolve_reduces([info.name for info in infos], cfg.reduce, cfg.reduce_by_layer)
    itemsize = TORCH_DTYPES[option_name(cfg.output.dtype)].itemsize
    rows = [("name", "type", "output shape", f"bytes/{feed.unit}")]
    for info in infos:
        if info.shape is None:
            rows.append((info.name, info.type, "(not run)", "-"))
            continue
        shape = info.shape[1:] if length is not None and info.shape[:1] == (length,) else \
            info.shape
        meta = torch.empty((1, *shape), device="meta")
        shape = tuple(reduce_tensor(meta, reduces[info.name]).shape[1:])
        note = f" x{info.calls} calls" if info.calls > 1 else ""
        rows.append((info.name, info.type, f"{shape}{note}",
                     human_bytes(itemsize * math.prod(shape))))
    return rows


@exit_on_user_error
def _list_layers(cfg: DictConfig) -> None:
    rows = layer_table(cfg)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def main() -> None:
    """``python -m probe.layers``: list the model's modules; writes no run folder."""
    sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                 "hydra/hydra_logging=none"]
    hydra_command("config", "python -m probe.layers")(_list_layers)()
