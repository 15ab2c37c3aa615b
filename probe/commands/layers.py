"""``python -m probe.layers model=...``: every module of the model, with the shape it stores for
one sample (one token, for rows per token) and the bytes that sample (token) adds to a file,
made by the same per-key transform as a run's (probe.keys); a vision transformer's token layout
(class and register tokens, patch grid) first, and a two-tower model's tower of each module.
Writes nothing, not even a run folder."""

from __future__ import annotations

import math
import sys

from omegaconf import DictConfig

from probe.commands import exit_on_user_error, hydra_command

__all__ = ["main", "layer_table"]


def layer_table(cfg: DictConfig, notes: list[str] | None = None) -> list[tuple[str, ...]]:
    """Rows of (name, type, stored shape, bytes per sample or per token, and for a two-tower
    model its tower), a header first; ``notes`` gets the token layout in words.

    A model that reads other data than the config's dataset (a language model and the default
    images, a 32 px ViT and 224 px images), or a two-tower model (both towers shown), is shown
    on a batch of its family's own making.

    Raises:
        ProbeError: a model, dataset or reduce that cannot work.
    """
    from probe.build import build_dataset, build_model
    from probe.errors import ConfigError
    from probe.families import family_for
    from probe.feeds import feed_for
    from probe.keys import key_transform
    from probe.layers import describe_layers
    from probe.reduce import resolve_reduces
    from probe.settings import read_settings
    from probe.units import human_bytes

    settings = read_settings(cfg)
    model = build_model(cfg)
    family = family_for(cfg.model, model)
    model, device = family.place(model, settings.device, settings.asked_device)
    towers = getattr(family, "towers", None)  # a two-tower model: its own batch runs both
    batch = family.example_batch(model) if towers else None
    if batch is None:
        dataset = build_dataset(cfg)
        try:
            family.check_data(model, feed_for(dataset))
            batch = feed_for(dataset).dry_batches(dataset, 0)[0]
        except ConfigError:
            batch = family.example_batch(model)
            if batch is None:
                raise
    positions = batch.keep is not None
    layout = family.token_layout(model, batch)
    on_device = batch.to(device)
    try:
        infos = describe_layers(model, lambda: family.forward(model, on_device))
    except (RuntimeError, ValueError):  # the data does not suit it (224 px for a 32 px ViT)
        batch = family.example_batch(model)
        if batch is None:
            raise
        layout, on_device = family.token_layout(model, batch), batch.to(device)
        infos = describe_layers(model, lambda: family.forward(model, on_device))
    grid = None if layout is None else layout.grid
    if notes is not None and _layout_line(layout) is not None:
        notes.append(_layout_line(layout))
    reduces = resolve_reduces([info.name for info in infos], settings.reduce,
                              settings.reduce_by_layer)
    itemsize = settings.output.dtype.itemsize
    unit = "tok" if positions and settings.tokens.name == "all" else "sample"
    rows = [("name", "type", "output shape", f"bytes/{unit}", *(("tower",) if towers else ()))]
    for info in infos:
        if info.shape is None:
            rows.append((info.name, info.type, "(not run)", "-", *_tower(info.name, towers)))
            continue
        raw = (1, *info.shape)
        is_layout = layout is not None and len(raw) >= 3 and raw[1] == layout.length
        try:
            transform = key_transform(f"{info.name}/output", raw, reduce=reduces[info.name],
                                      tokens=settings.tokens if is_layout else None,
                                      per_position=positions, prefix=layout.prefix if layout
                                      else 0, grid=grid)
        except ConfigError:  # a reduce this layer refuses: shown as it would be captured
            transform = key_transform(f"{info.name}/output", raw, reduce=reduces[info.name])
        shape = transform.row_shape
        note = f" x{info.calls} calls" if info.calls > 1 else ""
        rows.append((info.name, info.type, f"{shape}{note}",
                     human_bytes(itemsize * math.prod(shape)), *_tower(info.name, towers)))
    return rows


def _layout_line(layout) -> str | None:
    """A vision transformer's token layout in words (special tokens, patch grid)."""
    if layout is None or layout.grid is None:
        return None
    rows, columns = layout.grid
    return (f"token layout: {layout.length} tokens = {layout.prefix} class/register token(s) "
            f"+ {rows}x{columns} patches; tokens=patches stores (features, {rows}, {columns})")


def _tower(name: str, towers) -> tuple[str, ...]:
    if not towers:
        return ()
    from probe.families.towers import tower_of

    return (tower_of(name, towers) or "both",)


@exit_on_user_error
def _list_layers(cfg: DictConfig) -> None:
    notes: list[str] = []
    rows = layer_table(cfg, notes)
    for line in notes:
        print(line)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
              .rstrip())


def main() -> None:
    """``python -m probe.layers``: list the model's modules; writes no run folder."""
    sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                 "hydra/hydra_logging=none"]
    hydra_command("config", "python -m probe.layers")(_list_layers)()
