"""Fingerprints of the model and the data a file was made from, so that a run never resumes or
skips a file made from something else under the same config.

    model_fingerprint(model)      {"modules", "parameters", "weights", "code"}: digests of the
                                  module tree, the parameter names and shapes, the weights,
                                  and the source of model classes that are not torch's own
    data_fingerprint(dataset)     {"length"} and, for folder datasets, {"files", "num_files"}
                                  (relative paths and sizes); a dataset may add its own by
                                  defining ``fingerprint() -> dict``

Both are stored as JSON in the file's root attrs (probe.file.format.Attr); how two recorded
ones are compared is the file's (probe.file.recorded: ``changes``, ``loads``, ``dumps``).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import zlib
from pathlib import Path

import torch
from torch import nn

from probe.families.registry import model_libraries

__all__ = ["model_fingerprint", "data_fingerprint", "library_versions"]



def model_fingerprint(model: nn.Module) -> dict:
    """Digests of what makes a model compute what it computes."""
    modules = [f"{name}:{type(m).__module__}.{type(m).__qualname__}"
               for name, m in model.named_modules()]
    state = model.state_dict(keep_vars=False)
    parameters = [f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in state.items()]
    checksums: dict[tuple, int] = {}  # tied weights (an embedding and its head) are read once
    weights = []
    for name, tensor in state.items():
        same = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape),
                tensor.stride())
        if same not in checksums:
            checksums[same] = _crc(tensor)
        weights.append(f"{name}:{checksums[same]:08x}")
    code = {}
    libraries = model_libraries()  # their classes change only with their version, recorded
    for cls in {type(m) for m in model.modules()}:
        if cls.__module__.split(".")[0] not in libraries:
            try:
                code[f"{cls.__module__}.{cls.__qualname__}"] = _digest([inspect.getsource(cls)])
            except (OSError, TypeError):  # defined where no source is kept
                continue
    return {"modules": _digest(modules), "parameters": _digest(parameters),
            "weights": _digest(weights), "code": dict(sorted(code.items()))}


def library_versions() -> dict[str, str]:
    """``{"<library>_version": version}`` of the model families' libraries that this process
    imported (torch's is recorded always, by the store)."""
    found = {}
    for name in model_libraries():
        module = sys.modules.get(name)
        if module is not None and name != "torch":
            found[f"{name}_version"] = str(getattr(module, "__version__", ""))
    return found


def data_fingerprint(dataset) -> dict:
    """The dataset's length; the relative paths and sizes of its files when it lists them
    (torchvision's ImageFolder and DatasetFolder); and whatever its ``fingerprint()`` adds."""
    try:
        found: dict = {"length": len(dataset)}
    except TypeError:  # a stream has no length before it is read
        found = {}
    samples, root = getattr(dataset, "samples", None), getattr(dataset, "root", None)
    if isinstance(samples, list) and root is not None and samples and \
            isinstance(samples[0], (tuple, list)) and isinstance(samples[0][0], (str, Path)):
        lines = sorted(f"{os.path.relpath(path, root)}:{os.path.getsize(path)}:{label}"
                       for path, label, *_ in samples)
        found.update(files=_digest(lines), num_files=len(lines))
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        found.update(own())
    return found


def _crc(tensor: torch.Tensor) -> int:
    # a checksum of the raw bytes (a few GB/s), taken on the CPU one tensor at a time; an
    # offloaded weight (on the meta device, its values on disk) counts by its shape alone
    if tensor.is_meta:
        return 0
    data = tensor.detach().to("cpu").contiguous().reshape(-1)
    if data.numel() == 0:
        return 0
    return zlib.crc32(memoryview(data.view(torch.uint8).numpy()))


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
