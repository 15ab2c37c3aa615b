"""The runner: from a composed config to a finished HDF5 file.

``run(cfg)`` checks the config, builds the model and the dataset, attaches the hooks, and feeds
each batch's captures to a writer thread; the hooks are removed whether the run ends or fails.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm

from probe.config import option_name
from probe.data import has_targets, make_loader, select_indices, split_item
from probe.device import resolve_device
from probe.errors import ConfigError, OutputError, ProbeError, RunStopped
from probe.hooks import Capture, StopForward, parse_hooks
from probe.objectives import make_objective, per_sample
from probe.store import Store, check_free_space, check_output, file_locking
from probe.writer import BackgroundWriter

__all__ = ["run", "build", "output_path"]

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def run(cfg: DictConfig) -> Path:
    """Run the pipeline that ``cfg`` describes; return the path of the finished file.

    Re-running a config whose file is complete does nothing; a run stopped part-way (a crash,
    SIGKILL, SIGINT, SIGTERM) resumes after its last committed rows.

    Raises:
        ProbeError: a config value, file or device that cannot work (nothing is written), or
            ``RunStopped`` when a signal stopped the run (the committed rows are kept).
    """
    _check_numbers(cfg)
    hooks = parse_hooks(cfg.hooks)
    path = output_path(cfg)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    locking = file_locking(cfg.output.file_locking)
    resume_from = check_output(path, config_yaml, bool(cfg.output.overwrite), locking)
    if resume_from is None:
        log.info("%s is already complete for this config; nothing to do", path)
        return path

    device = resolve_device(cfg.device)
    model, dataset = build(cfg, device)
    indices = select_indices(len(dataset), cfg.limit, cfg.shard.index, cfg.shard.count)
    with_target = has_targets(dataset)
    objective, objective_name = make_objective(cfg.objective)
    if any(h.needs_grad for h in hooks) and objective_name == "target" and not with_target:
        raise ConfigError(
            "objective=target but the dataset has no targets; use objective=top1 or a dataset "
            "whose items are (input, target)"
        )
    capture = Capture(model, cfg.layers, hooks, reduce=cfg.reduce,
                      reduce_by_layer=cfg.reduce_by_layer,
                      dtype=_TORCH_DTYPES[option_name(cfg.output.dtype)],
                      stop_early=bool(cfg.stop_early))
    row_bytes = _bytes_per_row(capture, dataset[indices[0]], device)
    log.info("model %s on %s; %d layers x %s; %d samples of %.2f MiB -> %s",
             type(model).__name__, device, len(capture.layers), [h.name for h in hooks],
             len(indices), row_bytes / 2**20, path)
    if cfg.output.check_free_space:
        check_free_space(path.parent, row_bytes * (len(indices) - resume_from))

    store = Store(path, config_yaml=config_yaml, num_rows=len(indices), has_target=with_target,
                  resume_from=resume_from, dtype=option_name(cfg.output.dtype),
                  compression=option_name(cfg.output.compression),
                  compression_level=cfg.output.compression_level,
                  attrs=_run_attrs(cfg, capture, objective_name), locking=locking)
    writer = BackgroundWriter(store, attrs_for=capture.attrs,
                              commit_every_batches=int(cfg.output.commit_every),
                              commit_every_seconds=float(cfg.output.commit_seconds))
    started = time.perf_counter()
    try:
        loader = make_loader(dataset, indices[resume_from:], int(cfg.batch_size),
                             int(cfg.num_workers), pin_memory=device.type == "cuda")
        with capture, _frozen_parameters(model, capture.needs_grad), _stop_signals() as stop:
            _loop(model, loader, capture, writer, objective, device, stop,
                  total=len(indices), done=resume_from)
        writer.close()
        store.finish()
    except _Stopped as stopped:
        _close_after_failure(writer, store)
        saved = (f"with {store.num_committed} of {len(indices)} rows saved in {store.partial}; "
                 "run the same command again to resume" if store.partial.exists() else
                 "before any rows were saved; run the same command again to start")
        raise RunStopped(f"stopped by {stopped.signal.name} {saved}",
                         exit_code=128 + int(stopped.signal)) from None
    except BaseException:
        _close_after_failure(writer, store)
        raise
    seconds = time.perf_counter() - started
    log.info("wrote %d rows (%.1f MiB) in %.1f s to %s", len(indices) - resume_from,
             path.stat().st_size / 2**20, seconds, path)
    return path


def _loop(model: nn.Module, loader, capture: Capture, writer: BackgroundWriter, objective,
          device: torch.device, stop: list, *, total: int, done: int) -> None:
    """The main loop: one forward (and backward) per batch, captures handed to the writer."""
    with tqdm(total=total, initial=done, unit="sample", dynamic_ncols=True, mininterval=1.0,
              desc="probe") as bar:
        for index, inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            if capture.needs_grad:
                # parameters are frozen: the graph starts at the hooked modules (or at the
                # input, when gradients at a module's input are asked for)
                with torch.enable_grad():
                    output = model(inputs.requires_grad_(capture.wants_input_grad))
                    capture.backward(per_sample(objective, output, targets).sum())
            else:
                # StopForward: every hooked module has run, the rest of the model is not needed
                with torch.inference_mode(), suppress(StopForward):
                    model(inputs)
            writer.put(index, targets, capture.take(), ready=capture.copied)
            bar.update(len(index))
            if stop:
                raise _Stopped(stop[0])


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signal = signal.Signals(signum)


@contextmanager
def _stop_signals():
    """SIGINT and SIGTERM (Ctrl-C; SLURM before preemption or the time limit) ask the loop to
    stop at the next batch boundary. A second one acts as it would without probe."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested  # signal handlers can only be set from the main thread
        return
    previous: dict[int, object] = {}

    def handler(signum, frame):
        requested.append(signum)
        signal.signal(signum, previous[signum])
        log.warning("%s received: stopping after this batch", signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield requested
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _bytes_per_row(capture: Capture, item, device: torch.device) -> int:
    """Bytes that one sample adds to the file, from a full forward pass on that sample alone.

    The pass also finds unused or reused layers before any file is made, and for a
    forward-only run it is ``capture``'s first complete pass, which arms its early stop."""
    sample, _ = split_item(item)
    dry = capture
    if capture.needs_grad:  # gradients have the shapes of the outputs and inputs they belong to
        kinds = {"output": "forward", "grad_output": "forward", "input": "forward_pre",
                 "grad_input": "forward_pre"}
        dry = Capture(capture.model, capture.layers, sorted({kinds[h.kind] for h in capture.hooks}),
                      reduce_by_layer=capture.reduces, dtype=capture.dtype)
    with dry, torch.inference_mode():
        capture.model(sample.unsqueeze(0).to(device))
        seen = dry.take()
    size = 16  # index and target
    for key in capture.keys:
        layer, kind = key.rsplit("/", 1)
        value = seen[f"{layer}/{kind.removeprefix('grad_')}"]
        size += value[0].numel() * value.element_size()
    return size


def _close_after_failure(writer: BackgroundWriter, store: Store) -> None:
    # keep the complete batches already handed over (a resume continues after them); a file
    # this attempt created that holds no committed row is removed, so bad input leaves nothing
    try:
        writer.close()
    except BaseException as err:
        log.debug("writer stopped with %r", err)
    store.close(discard_if_empty=True)


def build(cfg: DictConfig, device: torch.device) -> tuple[nn.Module, torch.utils.data.Dataset]:
    """The model (eval mode, on ``device``, random init seeded by ``cfg.seed``) and the dataset.

    Raises:
        ConfigError: a model or dataset config that cannot be built.
    """
    if "name" in cfg.model and OmegaConf.is_missing(cfg.model, "name"):
        raise ConfigError("model.name is not set: add e.g. model.name=alexnet")
    torch.manual_seed(int(cfg.seed))
    model = _instantiate(cfg.model, "model")
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model: {cfg.model._target_} returned {type(model).__name__}, "
                          "not a torch.nn.Module")
    dataset = _instantiate(cfg.dataset, "dataset")
    return model.eval().to(device), dataset


def _instantiate(node: DictConfig, what: str):
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    missing = [k for k in node if OmegaConf.is_missing(node, k)]
    if missing:
        raise ConfigError(f"{what}.{missing[0]} is not set: add {what}.{missing[0]}=<value>")
    try:
        return instantiate(node)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, ProbeError):
            raise cause from None
        raise ConfigError(f"cannot build the {what} from its config: {err}") from None


def output_path(cfg: DictConfig) -> Path:
    """``output.path``, or ``<Hydra run dir>/features.h5`` when it is null.

    Raises:
        OutputError: output.path is null outside a Hydra run.
    """
    if cfg.output.path is not None:
        return Path(str(cfg.output.path)).expanduser().absolute()
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        raise OutputError("output.path is not set and there is no Hydra run directory; "
                          "set output.path=<file>.h5")
    return Path(HydraConfig.get().runtime.output_dir) / "features.h5"


def _check_numbers(cfg: DictConfig) -> None:
    if int(cfg.batch_size) < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} must be at least 1")
    if int(cfg.num_workers) < 0:
        raise ConfigError(f"num_workers={cfg.num_workers} must be 0 or more")


@contextmanager
def _frozen_parameters(model: nn.Module, active: bool):
    """Parameters stop requiring grad for the block (no weight gradients are built or
    accumulated); their flags are restored afterwards."""
    if not active:
        yield
        return
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def _run_attrs(cfg: DictConfig, capture: Capture, objective_name: str) -> dict:
    attrs = {"layers": list(capture.layers), "hooks": [h.name for h in capture.hooks],
             "shard_index": int(cfg.shard.index), "shard_count": int(cfg.shard.count)}
    if capture.needs_grad:
        attrs["objective"] = objective_name
    return attrs
