"""Command-line entry points: ``python -m probe`` and ``python -m probe.layers``.

Both compose the same Hydra config (conf/, plus the user's ``--config-dir``). A user error is
printed as one line and exits with status 1; Hydra reports config errors in its own words.
"""

from __future__ import annotations

import re
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from probe.config import CONFIG_DIR
from probe.errors import ProbeError

__all__ = ["main", "list_layers_main", "run_folder_name", "exit_on_user_error"]


def run_folder_name(overrides: str) -> str:
    """A folder name for a run from Hydra's ``override_dirname``, using only characters that
    neither a shell nor Hydra's override parser treat as syntax, so that the path can be typed
    back unquoted: ``layers=[features.28],model=vgg16`` -> ``layers-features.28+model-vgg16``."""
    name = overrides.replace("=", "-").replace(",", "+")
    name = re.sub(r"[\[\]]", "", name)
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name)
    return name or "default"


OmegaConf.register_new_resolver("probe_run_folder", run_folder_name, replace=True)


def _hydra_app(task):
    return hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")(task)


def exit_on_user_error(task):
    """Wrap a command (a Hydra task, or any function of one argument) so that a ProbeError
    prints one line and exits non-zero (1, or a stopped run's 128 + signal), not a traceback."""

    def wrapped(cfg: DictConfig) -> None:
        try:
            task(cfg)
        except ProbeError as err:
            print(f"probe: error: {err}", file=sys.stderr)
            sys.exit(getattr(err, "exit_code", 1))
    return wrapped


@exit_on_user_error
def _run(cfg: DictConfig) -> None:
    from probe.runner import run

    run(cfg)


@exit_on_user_error
def _list_layers(cfg: DictConfig) -> None:
    import torch

    from probe.config import option_name
    from probe.data import split_item
    from probe.device import resolve_device
    from probe.hooks import reduce_tensor, resolve_reduces
    from probe.layers import describe_layers
    from probe.runner import build

    model, dataset = build(cfg, resolve_device(cfg.device))
    sample, _ = split_item(dataset[0])
    itemsize = 2 if option_name(cfg.output.dtype) == "float16" else 4
    infos = describe_layers(model, sample)
    reduces = resolve_reduces([info.name for info in infos], cfg.reduce, cfg.reduce_by_layer)
    rows = [("name", "type", "output shape", "bytes/sample")]
    for info in infos:
        if info.shape is None:
            rows.append((info.name, info.type, "(not run)", "-"))
            continue
        meta = torch.empty((1, *info.shape), device="meta")
        shape = tuple(reduce_tensor(meta, reduces[info.name]).shape)
        note = f" x{info.calls} calls" if info.calls > 1 else ""
        size = itemsize * _prod(shape[1:])
        rows.append((info.name, info.type, f"{tuple(shape[1:])}{note}", _human(size)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())


def _prod(shape) -> int:
    size = 1
    for dim in shape:
        size *= dim
    return size


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def main() -> None:
    """``python -m probe``: run the pipeline."""
    _hydra_app(_run)()


def list_layers_main() -> None:
    """``python -m probe.layers``: list the model's modules; writes no run folder."""
    sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                 "hydra/hydra_logging=none"]
    _hydra_app(_list_layers)()
