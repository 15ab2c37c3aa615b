"""Linear probes: how well each stored "<layer>/<kind>" predicts the dataset's target.

    results = fit_probes("features.h5")   # [{"layer", "kind", "accuracy", "chance", ...}, ...]
    python -m probe.fit file=features.h5  # the same, plus probes.csv, probes.json, accuracy.png
                                          # (probe.commands.fit)

Each probe is a multinomial logistic regression (one linear layer and cross-entropy) on the
flattened rows, standardised with the mean and standard deviation of the training rows. The
rows are streamed from the file in mini-batches, a few HDF5 chunks at a time, so the features
never need to fit in memory. ``chance`` is the best accuracy that one constant answer gets on the
test rows (the share of their most frequent class), at least 1 / the number of classes. A fixed
``seed`` fixes the split, the shuffles and so the accuracies.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from probe.analyses.fit.config import FitConfig as _Defaults
from probe.analyses.stats import select_keys
from probe.analyses.tables import aligned, beside, write_csv, writing
from probe.config.device import resolve_device
from probe.errors import ConfigError
from probe.file.format import Attr, split_key
from probe.file.read import FeatureFile, open_checked

__all__ = ["fit_probes", "write_table", "format_table", "default_out_dir", "COLUMNS"]

log = logging.getLogger(__name__)

COLUMNS = ("layer", "kind", "accuracy", "chance", "n_train", "n_test")


def fit_probes(path: str | Path, keys: list[str] | None = None, *,
               test_fraction: float = _Defaults.test_fraction, folds: int | None = _Defaults.folds,
               seed: int = _Defaults.seed, epochs: int = _Defaults.epochs,
               batch_size: int = _Defaults.batch_size, lr: float = _Defaults.lr,
               weight_decay: float = _Defaults.weight_decay,
               device: str = _Defaults.device) -> list[dict]:
    """Fit one linear probe per stored dataset of a finished probe file and test it.

    The defaults are those of ``python -m probe.fit`` (probe.analyses.fit.config.FitConfig).

    Args:
        path: the file a probe run wrote; it needs a ``target`` dataset.
        keys: "<layer>/<kind>"s or "<layer>"s (all its kinds); None for every stored dataset.
        test_fraction: share of the rows held out for testing (ignored with ``folds``).
        folds: k-fold cross-validation instead: every row is tested once, by the probe that
            did not train on it; ``accuracy`` and ``chance`` pool all k folds and ``n_train``
            is the rows of one fold's training set (the smallest).
        seed: fixes the split, the shuffles and so the results.
        epochs: passes of Adam over the training rows.
        batch_size: rows per mini-batch.
        lr: Adam's learning rate.
        weight_decay: L2 penalty on the weights.
        device: where the probes train (``cpu``, ``cuda``, ``auto``, ...).

    Returns:
        One dict per dataset, with the keys of ``COLUMNS``: in the order of ``keys``, or of the
        model's layers (output before gradients) when ``keys`` is None.

    Raises:
        ProbeError: the file is missing, unfinished, has no targets or lacks a key; or a bad
            option (named, with its valid range).
    """
    _check_options(test_fraction, folds, epochs, batch_size, lr, weight_decay)
    torch_device = resolve_device(device)
    with open_checked(path) as f:
        target = f.target
        if target is None:
            raise ConfigError(
                f"{str(f.path)!r} has no 'target' dataset: the run's dataset gives no labels, so "
                "there is nothing to probe for; run probe with a dataset whose items are "
                "(input, int target), such as dataset=synthetic, imagefolder or cifar10"
            )
        classes = np.unique(target)
        if len(classes) < 2:
            raise ConfigError(f"every row of {str(f.path)!r} has target {classes[0]}; a probe "
                              "needs at least two classes")
        selected = select_keys(f, keys)
        token_rows = [key for key in selected if f.per_token(key)]
        if token_rows:
            raise ConfigError(
                f"{', '.join(token_rows)} hold one row per token (tokens=all), and a probe here "
                "fits one row per sample; run probe with tokens=last or tokens=mean"
            )
        _warn_about_label_gradients(f, selected)
        splits = _splits(f.target, test_fraction, folds, seed)
        train = dict(epochs=int(epochs), batch_size=int(batch_size), lr=float(lr),
                     weight_decay=float(weight_decay), seed=int(seed), device=torch_device)
        results = []
        for key in selected:
            results.append(_probe(f, key, torch.as_tensor(classes), splits, train))
            log.info("%s: accuracy %.3f (chance %.3f) on %d test rows", key,
                     results[-1]["accuracy"], results[-1]["chance"], results[-1]["n_test"])
    return results


def _warn_about_label_gradients(f: FeatureFile, keys: list[str]) -> None:
    # d logit[target] / d activation is computed from the label: a probe reads it back
    if str(f.attrs.get(Attr.OBJECTIVE, "")) != "target":
        return
    grads = [key for key in keys if split_key(key)[1].startswith("grad_")]
    if grads:
        log.warning("%s hold gradients of objective=target, which are computed from the label "
                    "itself: a probe on them can score near 1.0 by construction, whatever the "
                    "layer encodes; probe the outputs, or gradients of objective=top1",
                    ", ".join(grads))


def _check_options(test_fraction, folds, epochs, batch_size, lr, weight_decay) -> None:
    if folds is None and not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction={test_fraction} must be between 0 and 1, e.g. 0.25")
    if folds is not None and int(folds) < 2:
        raise ConfigError(f"folds={folds} must be at least 2, or null for one held-out split")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if int(value) < 1:
            raise ConfigError(f"{name}={value} must be at least 1")
    if not lr > 0:
        raise ConfigError(f"lr={lr} must be positive, e.g. 0.01")
    if weight_decay < 0:
        raise ConfigError(f"weight_decay={weight_decay} must be 0 or more")


def _splits(targets: np.ndarray, test_fraction: float, folds: int | None,
            seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, test rows) pairs, stratified: each class is split in the same proportion
    (the rows, ordered by class and at random within it, are dealt out in turn), and sorted so
    that streaming reads stay in file order."""
    num_rows = len(targets)
    if num_rows < 2:
        raise ConfigError(f"the file has {num_rows} row; a probe needs at least 2")
    shuffled = np.random.default_rng(seed).permutation(num_rows)
    order = shuffled[np.argsort(targets[shuffled], kind="stable")]
    turn = np.arange(num_rows)
    if folds is None:  # every 1/test_fraction-th row of that order, round(N * fraction) in all
        tested = (np.floor((turn + 1) * test_fraction + 0.5)
                  > np.floor(turn * test_fraction + 0.5))
        if not tested.any():
            tested[0] = True
        if tested.all():
            tested[-1] = False
        parts = [order[tested]]
    else:
        if int(folds) > num_rows:
            raise ConfigError(f"folds={folds} is more than the file's {num_rows} rows")
        parts = [order[turn % int(folds) == k] for k in range(int(folds))]
    return [(np.sort(np.setdiff1d(order, test)), np.sort(test)) for test in parts]


def _probe(f: FeatureFile, key: str, classes: torch.Tensor,
           splits: list[tuple[np.ndarray, np.ndarray]], train: dict) -> dict:
    target = f.target
    correct = chance = n_test = 0
    for train_rows, test_rows in splits:
        linear, mean, std = _train(f, key, classes, train_rows, **train)
        correct += _count_correct(f, key, classes, test_rows, linear, mean, std, train)
        chance += int(np.unique(target[test_rows], return_counts=True)[1].max())
        n_test += len(test_rows)
    layer, kind = split_key(key)
    return {"layer": layer, "kind": kind, "accuracy": correct / n_test, "chance": chance / n_test,
            "n_train": min(len(rows) for rows, _ in splits), "n_test": n_test}


def _train(f: FeatureFile, key: str, classes: torch.Tensor, rows: np.ndarray, *, epochs: int,
           batch_size: int, lr: float, weight_decay: float, seed: int,
           device: torch.device) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    # 1. the standardisation, from one streamed pass over the training rows
    mean, std = _moments(f.loader(key, batch_size=batch_size, rows=rows), device)
    # 2. a linear layer from zeros (the loss is convex: no init to seed, and torch's global
    # random state is left alone), trained by Adam
    linear = nn.utils.skip_init(nn.Linear, mean.numel(), len(classes), device=device)
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    optimizer = Adam(list(linear.parameters()), lr=lr, weight_decay=weight_decay)
    loader = f.loader(key, batch_size=batch_size, shuffle=True, seed=seed, rows=rows)
    classes = classes.to(device)
    for _ in range(epochs):
        for x, y in loader:
            logits = linear(_standardise(x, mean, std, device))
            loss = nn.functional.cross_entropy(logits, torch.searchsorted(classes, y.to(device)))
            optimizer.step(torch.autograd.grad(loss, optimizer.params))
    return linear, mean, std


class Adam:
    """The update of ``torch.optim.Adam`` (L2 ``weight_decay`` added to the gradient, no
    amsgrad), written out: constructing any torch optimizer imports torch._dynamo, which
    costs more seconds than fitting a probe takes. ``tests/test_fit.py`` holds it equal to
    torch's."""

    def __init__(self, params: list[torch.Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params, self.lr, self.weight_decay = params, lr, weight_decay
        self.betas, self.eps, self.steps = betas, eps, 0
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]

    @torch.no_grad()
    def step(self, grads: tuple[torch.Tensor, ...]) -> None:
        self.steps += 1
        beta1, beta2 = self.betas
        correction1, correction2 = 1 - beta1 ** self.steps, 1 - beta2 ** self.steps
        for param, grad, (mean, square) in zip(self.params, grads, self.moments, strict=True):
            grad = grad.add(param, alpha=self.weight_decay) if self.weight_decay else grad
            mean.lerp_(grad, 1 - beta1)
            square.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denominator = (square.sqrt() / correction2 ** 0.5).add_(self.eps)
            param.addcdiv_(mean, denominator, value=-self.lr / correction1)


@torch.no_grad()
def _count_correct(f: FeatureFile, key: str, classes: torch.Tensor, rows: np.ndarray,
                   linear: nn.Linear, mean: torch.Tensor, std: torch.Tensor, train: dict) -> int:
    device = train["device"]
    classes = classes.to(device)
    correct = 0
    for x, y in f.loader(key, batch_size=train["batch_size"], rows=rows):
        predicted = classes[linear(_standardise(x, mean, std, device)).argmax(1)]
        correct += int((predicted == y.to(device)).sum())
    return correct


@torch.no_grad()
def _moments(loader, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # float64 sums: a float32 sum of squares over many rows loses the variance
    total = squares = None
    count = 0
    for x, _ in loader:
        x = x.to(device=device, dtype=torch.float64).flatten(1)
        total = x.sum(0) if total is None else total + x.sum(0)
        squares = (x * x).sum(0) if squares is None else squares + (x * x).sum(0)
        count += len(x)
    mean = total / count
    std = (squares / count - mean * mean).clamp_min(0).sqrt()
    std[std < 1e-8] = 1.0  # a constant feature stays 0 after centring instead of dividing by 0
    return mean.float(), std.float()


def _standardise(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                 device: torch.device) -> torch.Tensor:
    return (x.to(device=device, dtype=torch.float32).flatten(1) - mean) / std


def default_out_dir(path: str | Path) -> Path:
    """``<file's folder>/<file stem>_fit``: where ``python -m probe.fit`` writes by default."""
    return beside(path, "fit")


def write_table(results: list[dict], out_dir: Path) -> list[Path]:
    """Write ``probes.csv`` and ``probes.json`` into ``out_dir``; return their paths.

    Raises:
        OutputError: ``out_dir`` cannot be written.
    """
    with writing(out_dir) as out_dir:
        write_csv(out_dir / "probes.csv", COLUMNS, results)
        (out_dir / "probes.json").write_text(json.dumps(results, indent=2) + "\n")
    return [out_dir / "probes.csv", out_dir / "probes.json"]


def format_table(results: list[dict]) -> str:
    """The results as an aligned text table, one line per probe."""
    return aligned([COLUMNS] + [(r["layer"], r["kind"], f"{r['accuracy']:.3f}",
                                 f"{r['chance']:.3f}", str(r["n_train"]), str(r["n_test"]))
                                for r in results])
