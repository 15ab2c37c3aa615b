"""Hooks owned by a context manager: attached on entry, every one removed on exit, even on error.

``attach(model, layers, hooks)`` returns a ``Capture``. Inside the ``with`` block each forward pass
leaves, under ``"<layer>/<kind>"``, a copy of what the hooked modules saw, taken at hook time (so
an in-place op that runs later, such as vgg16's ReLU after ``features.28``, cannot change it).
What each hook captures is its capture kind's to say (probe.pipeline.kinds lists them, and
takes new ones); gradient kinds are filled by ``Capture.backward(objective)``.

A module that runs several times in one forward pass (resnet's shared ReLU) gives one value per
run: ``<layer>/output`` for the first, ``<layer>/output_1``, ``_2``, ... for later ones.

The hook object only hooks and copies. A run hands it the dry run's findings once (``arm``)
and makes each batch's rows in a block of its own (``with capture.batch(layout) as rows``:
probe.pipeline.batch_rows), which owns what one batch needs: its layout, the copies off the
GPU, the early stop, the calls of a model called several times on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from probe.config.schema import Reduce
from probe.data.layouts import SAMPLE_ROWS, RowLayout
from probe.errors import ConfigError
from probe.families.base import Family
from probe.file.format import Attr, call_key, parse_kind, split_key
from probe.pipeline.batch_rows import BatchRows, StopForward
from probe.pipeline.compact import Compact, encoding_for
from probe.pipeline.keys import KeyTransform, reduce_tensor
from probe.pipeline.kinds import CaptureKind, Target, capture_kinds
from probe.pipeline.modules import resolve_layers
from probe.pipeline.reduce import resolve_reduces

__all__ = ["attach", "Capture", "StopForward"]


def attach(model: nn.Module, layers: Iterable[str],
           hooks: Iterable[str | CaptureKind] = ("forward",), *, reduce: str | Reduce = "none",
           reduce_by_layer: Mapping[str, str | Reduce] | None = None,
           dtype: torch.dtype | None = None) -> Capture:
    """Hooks on ``layers`` of ``model`` for the duration of a ``with`` block.

    Example::

        with probe.attach(model, ["features.28"]) as cap:
            model(inputs)
            conv_out = cap["features.28/output"]

    Args:
        model: the model; its mode and parameters are left as they are.
        layers: module names, globs or standard names (``blocks.6``), as in the ``layers``
            config key.
        hooks: capture kinds, by their names in ``hooks=`` (forward, forward_pre, backward,
            backward_input, ...) or as objects (probe.pipeline.kinds).
        reduce: none, mean, max (over the axes after the channel axis) or flatten.
        reduce_by_layer: exceptions to ``reduce``: {layer name or glob: reduce}; a layer's own
            name beats a glob, and globs that match one layer must agree.
        dtype: store copies in this dtype (None keeps the module's).

    Raises:
        ConfigError: an unknown layer, hook or reduce.
    """
    return Capture(model, layers, hooks, reduce=reduce, reduce_by_layer=reduce_by_layer,
                   dtype=dtype)


class Capture:
    """What hooked modules saw in the latest forward (and backward) pass.

    Example::

        with Capture(model, ["layer4"], ["forward", "backward"]) as cap:
            logits = model(inputs.requires_grad_())
            cap.backward(logits.amax(1).sum())
            act, grad = cap["layer4/output"], cap["layer4/grad_output"]

    ``family`` gives what only a model's family can (found from the model's classes where
    not given). A ``dry`` capture learns shapes in a forward pass alone: a gradient kind's
    value is then the tensor it would differentiate at.
    """

    def __init__(self, model: nn.Module, layers: Iterable[str],
                 hooks: Iterable[str | CaptureKind] = ("forward",), *,
                 reduce: str | Reduce = "none",
                 reduce_by_layer: Mapping[str, str | Reduce] | None = None,
                 dtype: torch.dtype | None = None, stop_early: bool = False,
                 family: Family | None = None, dry: bool = False):
        self.model = model
        if family is None:  # the kinds and the standard names need one
            from probe.families.registry import family_for  # the one lookup of a family

            family = family_for(None, model)
        # each hooked layer by the name its datasets take -> its module's path (a standard
        # name's, or the path itself); a mapping given is taken as resolved already
        self.paths = dict(layers) if isinstance(layers, Mapping) else resolve_layers(
            model, layers, family.names(model))
        self.layers = list(self.paths)
        self.kinds = capture_kinds(hooks)
        # layer -> how its values are reduced where no transform says otherwise
        self.reduces = resolve_reduces(self.layers, reduce, reduce_by_layer)
        self.dtype = dtype
        self.needs_grad = any(kind.needs_grad for kind in self.kinds)
        # forward-only: once the calls are known, a pass stops as soon as it has given its
        # last value (the layers after it compute nothing that is stored)
        self.stop_early = stop_early and not self.needs_grad
        # How often each hooked module runs in one forward pass: armed (a dry run's count)
        # or learned from the first complete pass; every later pass must run them as often
        self.calls: dict[str, int] | None = None
        # "<layer>/<kind>" -> its position in the module's tuple, or the keyword it was given by
        self.where: dict[str, int | str] = {}
        # the events after the copies from a GPU of the values ``take()`` handed over (None:
        # nothing to wait for)
        self.copied: list[torch.cuda.Event] | None = None
        self._family, self._dry = family, dry
        self._transforms: dict[str, KeyTransform] = {}  # armed: each key's rows
        self.compact = Compact(encoding_for(dtype))  # what each key's datasets store of them
        self._rows = self._new_rows(SAMPLE_ROWS)  # the rows of the pass under way
        self._ran: dict[tuple[str, str], int] = {}  # (layer, kind) -> runs so far in this pass
        self._edges: dict[str, GradientEdge] = {}
        self._checks: list = []  # the kinds' checks of layers that gave no value
        self._exits = ExitStack()

    @property
    def keys(self) -> list[str]:
        """Every "<layer>/<kind>" this capture fills, layer by layer and run by run (before
        the calls are known, one run of each layer)."""
        calls = self.calls or {}
        return [call_key(layer, kind.kind, call) for layer in self.layers
                for call in range(calls.get(layer, 1)) for kind in self.kinds]

    def attrs(self, key: str) -> dict:
        """What the file records about the dataset "<layer>/<kind>"."""
        layer, kind = split_key(key)
        kind, call = parse_kind(kind)
        own = next(k for k in self.kinds if k.kind == kind)
        transform = self._transforms.get(key)
        reduce = self.reduces[layer] if transform is None else transform.reduce
        attrs = {Attr.LAYER: layer, Attr.HOOK: own.hook, Attr.KIND: kind,
                 Attr.REDUCE: reduce.name}
        if self.paths[layer] != layer:  # a standard name: the module it resolved to
            attrs[Attr.MODULE] = self.paths[layer]
        if (self.calls or {}).get(layer, 1) > 1:
            attrs[Attr.CALL] = call
        if self.dtype is not None:
            attrs[Attr.DTYPE] = str(self.dtype).removeprefix("torch.")
        where = self.where.get(key)
        if where is not None:
            attrs[Attr.KEYWORD if isinstance(where, str) else Attr.TUPLE_POSITION] = where
        return {**attrs, **own.attrs}

    def arm(self, calls: Mapping[str, int], where: Mapping[str, int | str],
            transforms: Mapping[str, KeyTransform] | None = None,
            compact: Compact | None = None) -> None:
        """Hand over what a dry run found, before the first pass: how often each hooked
        module runs, where each value sat in a tuple, each key's transform (how its rows are
        made) and what its datasets store of them (``compact``: projected, encoded; None
        keeps the cast to ``dtype``). Passes then stop early where they may."""
        self.calls, self.where = dict(calls), dict(where)
        self._transforms = dict(transforms or {})
        if compact is not None:
            self.compact = compact
        self._rows = self._new_rows(SAMPLE_ROWS)

    @contextmanager
    def batch(self, layout: RowLayout | None = None) -> Iterator[BatchRows]:
        """For the block, the values captured are one batch's rows, made by ``layout``;
        without a layout, the model is called several times on the batch, each call adding
        positions, and ``rows.take(layout)`` makes them. The block may stop
        a forward pass early (StopForward, for the pass to catch).

        Raises:
            ConfigError: a hooked module that did not run (or ran fewer times than the
                others' calls say), or gradients asked for but ``backward`` not called.
        """
        rows = self._rows = self._new_rows(layout)
        try:
            yield rows
            self._check(rows)
        finally:
            self._rows = self._new_rows(SAMPLE_ROWS)

    # -- lifetime -----------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        modules = dict(self.model.named_modules())
        target = Target(self.model, {layer: modules[path] for layer, path in self.paths.items()},
                        self._family)
        self._checks = []  # kept after the block: a pass taken after it is checked too
        try:
            # a new forward pass starts: forget the last one's values
            self._exits.callback(self.model.register_forward_pre_hook(self._restart).remove)
            for kind in self.kinds:
                check = self._exits.enter_context(kind.attach(target, partial(self._keep,
                                                                              kind)))
                if check is not None:
                    self._checks.append(check)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove every hook, newest first, and drop references to the graph."""
        self._exits.close()
        self._edges.clear()

    # -- reading ------------------------------------------------------------------------------

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self._rows.values[key]
        except KeyError:
            raise KeyError(f"{key!r} was not captured; captured: "
                           f"{sorted(self._rows.values)}") from None

    def take(self) -> dict[str, torch.Tensor]:
        """Hand over the latest pass's values (every key, in ``keys`` order) and forget them.

        Raises:
            ConfigError: a hooked module did not run, or gradients were asked for but
                ``backward`` was not called.
        """
        rows = self._rows
        self._check(rows)
        self._rows = self._new_rows(SAMPLE_ROWS)
        values = rows.take(order=self.keys)
        self.copied = rows.ready
        return values

    # -- gradients ----------------------------------------------------------------------------

    def backward(self, objective: torch.Tensor) -> None:
        """Differentiate the scalar ``objective`` with respect to the hooked tensors only.

        The gradients are taken at the graph edges recorded when each module ran, so an
        in-place op applied afterwards (a ReLU(inplace=True) on a conv's output) does not shift
        them: they are d objective / d the module's own output or input.

        Raises:
            ConfigError: the objective does not depend on a hooked layer.
        """
        keys = list(self._edges)
        if not keys:
            return
        if objective.requires_grad:
            grads = torch.autograd.grad(objective, [self._edges[key] for key in keys],
                                        allow_unused=True)
        else:  # no hooked tensor leads to it
            grads = [None] * len(keys)
        self._edges.clear()
        for key, grad in zip(keys, grads, strict=True):
            if grad is None:
                raise ConfigError(
                    f"the objective does not depend on {split_key(key)[0]!r}, so it has no "
                    "gradient there; choose a layer that lies between the input and the output"
                )
            self._rows.add(key, grad)

    # -- what the hooks call ------------------------------------------------------------------

    def _keep(self, kind: CaptureKind, layer: str, tensor: torch.Tensor,
              where: int | str | None = None) -> None:
        # a kind's value of the current run of ``layer``: a copy, or a gradient's graph edge
        run = self._ran.get((layer, kind.kind), 0)
        self._ran[layer, kind.kind] = run + 1
        if self.calls is not None and run >= self.calls[layer]:
            raise ConfigError(
                f"layer {layer!r} ran more than {self.calls[layer]} time(s) in one forward pass, "
                "as often as in the first pass: the runs of a module must be the same for every "
                "batch")
        key = call_key(layer, kind.kind, run)
        if where is not None:
            self.where[key] = where
        if not kind.needs_grad or self._dry:
            self._rows.add(key, tensor)
        elif not tensor.requires_grad:
            raise ConfigError(
                f"layer {layer!r}: its {kind.of} does not depend on the input, so it has no "
                "gradient; choose a layer that the input flows through")
        else:
            self._edges[key] = get_gradient_edge(tensor)

    def _restart(self, module: nn.Module, args) -> None:
        self._rows.restart()
        self._edges.clear()
        self._ran.clear()

    def _new_rows(self, layout: RowLayout | None) -> BatchRows:
        """The rows of a pass (a batch) of ``layout``, each key's made by its transform (not
        armed: reduced, as captured); stopped early once the calls are known."""
        transforms, reduces = self._transforms, self.reduces

        def rows_of(key: str, value: torch.Tensor, layout: RowLayout) -> torch.Tensor:
            transform = transforms.get(key)
            if transform is None:
                return reduce_tensor(value, reduces[split_key(key)[0]])
            return transform(value, layout)

        armed = self.stop_early and self.calls is not None
        axes = {key: t.axes for key, t in transforms.items() if t.axes is not None}
        return BatchRows(rows_of, self.compact, layout, axes=axes,
                         stop_after=len(self.keys) if armed else None)

    def _check(self, rows: BatchRows) -> None:
        """Refuse a pass that did not give every key; the first complete pass tells how
        often each module runs."""
        learned = self.calls is None
        if learned:
            self.calls = {layer: max([0, *(n for (name, _), n in self._ran.items()
                                           if name == layer)]) for layer in self.layers}
        missing = [key for key in self.keys if key not in rows.keys]
        idle = [layer for layer, n in self.calls.items() if n == 0]
        self._ran.clear()  # the next pass counts from 0, even where the model's root is not
        if not (missing or idle):  # called (a family that calls one of its methods)
            return
        if learned:
            self.calls = None
        gave_none = {split_key(key)[0] for key in missing} | set(idle)
        for check in self._checks:
            check([layer for layer in self.layers if layer in gave_none])
        if idle:
            raise ConfigError(
                f"nothing was captured for {', '.join(idle)}: the module did not run in the "
                "forward pass; choose layers that the forward uses")
        raise ConfigError(
            f"nothing was captured for {', '.join(missing)}: the module ran fewer times "
            "than in the first pass (the runs of a module must be the same for every "
            "batch), or backward was not called")
