"""Grad-CAM maps from a conv layer's stored output and grad_output.

    maps = gradcam(output, grad_output)            # (N, C, H, W) twice -> (N, H, W)
    path = write_gradcam("features.h5", "layer4")   # streams the rows into features_gradcam.h5
    python -m probe.gradcam file=features.h5 layer=layer4   # the same, plus a PNG montage
                                                            # (probe.commands.gradcam)

Grad-CAM (Selvaraju et al., 2017) weighs each channel of the activation ``A`` by the mean of
its gradient over the spatial axes and keeps the positive part of the weighted sum:
``map = ReLU(sum_c w_c A_c)`` with ``w_c = mean_hw dy/dA_c``. ``y`` is the run's ``objective``
(the top class's logit by default). The input file is only read; the maps go to a new file
laid out like a probe file (``index``, ``target``, ``<layer>/gradcam``, the run's ``config``),
so ``probe.open`` reads it too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import h5py
import numpy as np
import torch
from omegaconf import DictConfig

from probe.analyses.gradcam.config import GradcamConfig as _Defaults
from probe.errors import ConfigError, OutputError
from probe.file.format import Attr, DatasetSpec, partial_path
from probe.file.read import FeatureFile, open_checked
from probe.file.rows import row_blocks
from probe.file.store import Store

__all__ = ["gradcam", "write_gradcam", "save_montage", "default_output"]

log = logging.getLogger(__name__)

_BLOCK_BYTES = 64 << 20  # rows of output and grad_output read at once, by default


def gradcam(output: np.ndarray | torch.Tensor, grad_output: np.ndarray | torch.Tensor,
            normalize: bool = _Defaults.normalize) -> np.ndarray | torch.Tensor:
    """Grad-CAM maps of a batch: ``ReLU(sum_c mean_hw(grad_output)[c] * output[c])``.

    Args:
        output: (N, C, H, W) activations of a conv layer.
        grad_output: (N, C, H, W) gradients of the objective with respect to ``output``.
        normalize: divide each map by its own maximum, so that each peaks at 1; a map that is
            0 everywhere stays 0. Off, maps keep their scale and compare across samples.

    Returns:
        (N, H, W) float32 maps, numpy when ``output`` is numpy, else a tensor.

    Raises:
        ValueError: the arrays are not 4-D or differ in shape.
    """
    as_numpy = isinstance(output, np.ndarray)
    acts = torch.as_tensor(output, dtype=torch.float32)
    grads = torch.as_tensor(grad_output, dtype=torch.float32, device=acts.device)
    if acts.ndim != 4 or acts.shape != grads.shape:
        raise ValueError(f"gradcam needs two (N, C, H, W) arrays of one shape, got "
                         f"{tuple(acts.shape)} and {tuple(grads.shape)}")
    weights = grads.mean(dim=(2, 3))
    maps = torch.relu(torch.einsum("nc,nchw->nhw", weights, acts))
    if normalize:
        peak = maps.amax(dim=(1, 2), keepdim=True)
        maps = torch.where(peak > 0, maps / peak.clamp_min(torch.finfo(maps.dtype).tiny), maps)
    return maps.numpy() if as_numpy else maps


def default_output(path: str | Path) -> Path:
    """``<file's folder>/<file stem>_gradcam.h5``: where the maps go by default."""
    path = Path(path)
    return path.with_name(f"{path.stem}_gradcam.h5")


def write_gradcam(path: str | Path, layer: str | None = _Defaults.layer,
                  output: str | Path | None = _Defaults.output,
                  normalize: bool = _Defaults.normalize,
                  block_rows: int | None = _Defaults.block_rows,
                  overwrite: bool = _Defaults.overwrite) -> Path:
    """Compute the Grad-CAM map of every row of ``path`` and store them in a new file.

    The rows are read in blocks of whole HDF5 chunks, so the file may be larger than memory.
    The new file holds ``index`` and ``target`` (copied), ``<layer>/gradcam`` (N, H, W) and the
    run's ``config``; it is written as ``<output>.partial`` and renamed once complete. A file
    at ``output`` already is refused unless ``overwrite``, which replaces it.

    Args:
        path: a finished probe file with ``<layer>/output`` and ``<layer>/grad_output``.
        layer: the conv layer; None picks the only layer that has both.
        output: the file to write; None for ``default_output(path)``.
        normalize: scale each map to a maximum of 1 (see ``gradcam``).
        block_rows: rows computed at a time; None for whole chunks of about 64 MiB.
        overwrite: replace a file at ``output``.

    Returns:
        The path of the written file.

    Raises:
        ProbeError: the file is missing or unfinished, lacks the layer's output or
            grad_output, or they are not (N, C, H, W); the output cannot be written.
    """
    with open_checked(path) as f:
        layer = _pick_layer(f, layer)
        acts, grads = _conv_pair(f, layer)
        target = Path(output) if output is not None else default_output(f.path)
        if target.resolve() == f.path.resolve():
            raise ConfigError(f"output={str(target)!r} is the input file; the input is never "
                              "modified: choose another output")
        if target.exists() and not overwrite:
            raise OutputError(f"output={str(target)!r} holds earlier Grad-CAM maps; choose "
                              "another output, or set overwrite=true to replace them")
        if block_rows is not None and int(block_rows) < 1:
            raise ConfigError(f"block_rows={block_rows} must be at least 1, or null")
        row_bytes = 2 * acts.dtype.itemsize * int(np.prod(acts.shape[1:]))
        rows = int(block_rows) if block_rows else max(1, _BLOCK_BYTES // row_bytes)
        _write(f, layer, acts, grads, target, bool(normalize), rows)
    log.info("wrote the Grad-CAM maps of %s (%d rows, %s) to %s", layer, f.num_rows,
             "normalised" if normalize else "not normalised", target)
    return target


def _pick_layer(f: FeatureFile, layer: str | None) -> str:
    if layer is not None:
        return str(layer)
    both = [name for name in f.layers if {"output", "grad_output"} <= set(f.kinds(name))]
    if len(both) == 1:
        return both[0]
    if not both:
        raise ConfigError(
            f"{str(f.path)!r} has no layer with both output and grad_output (it holds "
            f"{f.features}); run probe with 'hooks=[forward,backward]' and reduce=none"
        )
    raise ConfigError(f"layer is not set and {str(f.path)!r} has several candidates {both}; "
                      f"pass one, e.g. layer={both[-1]}")


def _conv_pair(f: FeatureFile, layer: str) -> tuple[h5py.Dataset, h5py.Dataset]:
    missing = [kind for kind in ("output", "grad_output") if kind not in f.kinds(layer)]
    if missing:
        layers = [str(name) for name in f.attrs.get("layers", f.layers)]
        layers += [] if layer in layers else [layer]
        raise ConfigError(
            f"Grad-CAM needs {layer}/output and {layer}/grad_output, but {str(f.path)!r} has no "
            f"{' or '.join(f'{layer}/{kind}' for kind in missing)} (it holds {f.features}); run "
            f"probe with 'layers=[{','.join(layers)}]' 'hooks=[forward,backward]' reduce=none"
        )
    acts, grads = f[f"{layer}/output"], f[f"{layer}/grad_output"]
    if acts.ndim != 4 or acts.shape != grads.shape:
        reduce = str(acts.attrs.get("reduce", "none"))
        fix = (f"the run stored it with reduce={reduce}: run probe again with reduce=none "
               f"(or 'reduce_by_layer={{{layer}:none}}')"
               if reduce != "none" else "choose a conv layer (such as layer4 of a resnet)")
        raise ConfigError(
            f"Grad-CAM needs (N, C, H, W) rows, but {layer}/output has shape {acts.shape} and "
            f"{layer}/grad_output {grads.shape}; {fix}"
        )
    return acts, grads


def _write(f: FeatureFile, layer: str, acts: h5py.Dataset, grads: h5py.Dataset, target: Path,
           normalize: bool, block_rows: int) -> None:
    # a Store, as a run's: written as <target>.partial, renamed once complete
    index, labels = torch.from_numpy(f.index), f.target
    key = f"{layer}/gradcam"
    spec = DatasetSpec(tuple(acts.shape[2:]), "float32",
                       {Attr.LAYER: layer, Attr.KIND: "gradcam", "normalize": normalize,
                        Attr.OBJECTIVE: str(f.attrs.get(Attr.OBJECTIVE, "top1"))})
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        store = Store(target, config_yaml=str(f.attrs[Attr.CONFIG]), num_rows=f.num_rows,
                      datasets={key: spec}, has_target=labels is not None,
                      attrs={"source": str(f.path.resolve()), "normalize": normalize,
                             Attr.LAYERS: [layer]})
    except OSError as err:
        raise OutputError(f"cannot write {str(partial_path(target))!r} ({err.strerror or err}); "
                          "choose a writable output") from None
    with store:
        for start, stop in row_blocks(acts, f.num_rows, block_rows):
            store.append(index[start:stop],
                         None if labels is None else torch.from_numpy(labels[start:stop]),
                         {key: gradcam(acts[start:stop], grads[start:stop], normalize)})
        store.finish()


def save_montage(path: str | Path, num_images: int = _Defaults.num_images,
                 png: str | Path | None = None) -> Path:
    """Draw the first ``num_images`` maps of a file ``write_gradcam`` wrote, upsampled over
    their input images, to ``png`` (default: the file's path with ``.png``).

    The images come from the run's dataset, rebuilt from the stored config and indexed by the
    stored ``index``; ImageNet-normalised datasets are un-normalised for display, others are
    scaled to [0, 1] per image. When the dataset cannot be rebuilt (its files moved, say), the
    maps are drawn alone and a warning says why.

    Raises:
        ProbeError: the file is not finished; matplotlib is missing; the PNG cannot be written.
    """
    from probe.analyses.plots import gradcam_montage

    path = Path(path)
    with open_checked(path) as f:
        layer = f.layers[0]
        count = max(1, min(int(num_images), f.num_rows))
        maps = f[f"{layer}/gradcam"][:count]
        index = f.index[:count]
        targets = f.target
        images = _images(f.config, index)
    labels = [f"#{i}" if targets is None else f"#{i} y={targets[n]}"
              for n, i in enumerate(index)]
    if images is not None:
        maps = torch.nn.functional.interpolate(
            torch.from_numpy(maps)[:, None], size=images.shape[1:3], mode="bilinear",
            align_corners=False)[:, 0].clamp_min(0).numpy()
    return gradcam_montage(maps, png or path.with_suffix(".png"), images=images, labels=labels,
                           title=f"Grad-CAM of {layer}")


def _images(config: DictConfig, index: np.ndarray) -> np.ndarray | None:
    # (K, H, W, 3) images in [0, 1] for display, or None (with a warning) when unavailable
    try:
        from probe.data.tensors import split_item
        from probe.families.build import build_dataset

        dataset = build_dataset(config)
        images = torch.stack([split_item(dataset[int(i)])[0] for i in index]).float()
        normalised = _normalisation(dataset)
    except Exception as err:  # any failure of the user's dataset code: draw the maps alone
        log.warning("cannot rebuild the run's dataset to draw its images (%s: %s); drawing the "
                    "maps alone", type(err).__name__, err)
        return None
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        log.warning("the dataset's inputs have shape %s, not images; drawing the maps alone",
                    tuple(images.shape[1:]))
        return None
    images = images.expand(-1, 3, -1, -1).permute(0, 2, 3, 1).numpy().astype(np.float64)
    if normalised is not None:  # undone: the images as they were before the transform
        mean, std = normalised
        return np.clip(images * np.array(std) + np.array(mean), 0, 1)
    low = images.min(axis=(1, 2, 3), keepdims=True)
    high = images.max(axis=(1, 2, 3), keepdims=True)
    return (images - low) / np.where(high > low, high - low, 1)


def _normalisation(dataset) -> tuple[list[float], list[float]] | None:
    # the mean and std that the dataset's transform normalises its images with, if it does
    from probe.data.transforms import describe_transform

    transform = getattr(dataset, "transform", None)
    found = {} if transform is None else describe_transform(transform)
    if "mean" in found and "std" in found and len(found["mean"]) in (1, 3):
        return found["mean"], found["std"]
    return None
