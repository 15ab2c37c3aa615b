"""PNG figures of results: probe accuracy by layer, a Grad-CAM montage, a similarity heatmap and
encoding scores by layer.

matplotlib is imported here only, inside the functions, so the rest of probe never needs it
(``pip install 'probe[viz]'``). Figures are drawn without pyplot, so no display is ever needed.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from probe.errors import ConfigError, OutputError

log = logging.getLogger(__name__)

__all__ = ["can_plot", "plot_accuracy", "gradcam_montage", "plot_similarity", "plot_encoding"]


def plot_accuracy(results: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Held-out accuracy by layer, one line per kind, with the chance level dashed.

    Args:
        results: rows of ``probe.analyses.fit.fit_probes``, layers in file order.
        path: the PNG to write.
        title: drawn above the axes.

    Raises:
        ConfigError: matplotlib is not installed.
        OutputError: the PNG cannot be written.
    """
    layers = list(dict.fromkeys(r["layer"] for r in results))
    figure, axes = _by_layer(layers, [(r["layer"], r["kind"], r["accuracy"]) for r in results])
    chance = [max(r["chance"] for r in results if r["layer"] == layer) for layer in layers]
    axes.plot(range(len(layers)), chance, linestyle="--", color="grey",
              label="chance (majority class)")
    axes.set_ylim(0, 1.02)
    return _finish(figure, axes, "held-out accuracy", title, path)


def gradcam_montage(maps: np.ndarray, path: str | Path, images: np.ndarray | None = None,
                    labels: Sequence[str] | None = None, title: str | None = None) -> Path:
    """Grad-CAM maps of a few samples, over their images when given.

    Args:
        maps: (K, H, W) maps, already at the images' size when ``images`` is given; each is
            scaled to its own maximum for display.
        path: the PNG to write.
        images: (K, H, W, 3) images in [0, 1] to draw above and under the maps, or None to
            draw the maps alone.
        labels: one caption per sample.
        title: drawn above the montage.

    Raises:
        ConfigError: matplotlib is not installed.
        OutputError: the PNG cannot be written.
    """
    figure_class = _figure_class()
    count = len(maps)
    rows = 1 if images is None else 2
    figure = figure_class(figsize=(1.6 * count, 1.7 * rows + 0.3), dpi=100, layout="constrained")
    grid = figure.subplots(rows, count, squeeze=False)
    for i in range(count):
        cam = maps[i] / maps[i].max() if maps[i].max() > 0 else maps[i]
        if images is None:
            grid[0, i].imshow(cam, cmap="jet", vmin=0, vmax=1)
        else:
            grid[0, i].imshow(images[i])
            grid[1, i].imshow(images[i])
            grid[1, i].imshow(cam, cmap="jet", vmin=0, vmax=1, alpha=0.5)
        if labels is not None:
            grid[0, i].set_title(labels[i], fontsize="small")
    for axes in grid.flat:
        axes.set_axis_off()
    if title:
        figure.suptitle(title, fontsize="medium")
    return _save(figure, path)


def plot_similarity(matrix: np.ndarray, keys_a: Sequence[str], keys_b: Sequence[str],
                    path: str | Path, label: str = "similarity", title: str | None = None
                    ) -> Path:
    """A heatmap of similarities: a row per key of the first file, a column per key of the
    second, both in the order given (the model's); each cell printed when there are few.

    Args:
        matrix: (len(keys_a), len(keys_b)) values, NaN drawn blank.
        keys_a, keys_b: the labels of the rows and of the columns.
        path: the PNG to write.
        label: the colour bar's label (the metric).
        title: drawn above the axes.

    Raises:
        ConfigError: matplotlib is not installed.
        OutputError: the PNG cannot be written.
    """
    figure_class = _figure_class()
    matrix = np.asarray(matrix, dtype=float)
    rows, cols = matrix.shape
    figure = figure_class(figsize=(max(4.0, 0.7 * cols + 3.0), max(3.0, 0.5 * rows + 2.0)),
                          dpi=100, layout="constrained")
    axes = figure.add_subplot()
    low = min(0.0, float(np.nanmin(matrix))) if np.isfinite(matrix).any() else 0.0
    image = axes.imshow(matrix, cmap="viridis", vmin=low, vmax=1.0, aspect="auto")
    figure.colorbar(image, ax=axes, label=label)
    axes.set_xticks(range(cols), list(keys_b), rotation=45 if cols > 2 else 0,
                    ha="right" if cols > 2 else "center", fontsize="small")
    axes.set_yticks(range(rows), list(keys_a), fontsize="small")
    if rows * cols <= 144:
        for i in range(rows):
            for j in range(cols):
                if np.isfinite(matrix[i, j]):
                    axes.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center",
                              fontsize="x-small",
                              color="black" if matrix[i, j] > 0.6 else "white")
    if title:
        axes.set_title(title, fontsize="medium")
    return _save(figure, path)


def plot_encoding(results: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Encoding score (mean held-out Pearson r over the targets) by layer, one line per kind.

    Args:
        results: dicts with ``key`` ("<layer>/<kind>") and ``score``, layers in model order.
        path: the PNG to write.
        title: drawn above the axes.

    Raises:
        ConfigError: matplotlib is not installed.
        OutputError: the PNG cannot be written.
    """
    split = [(r["key"].rpartition("/")[0], r["key"].rpartition("/")[2], r["score"])
             for r in results]
    figure, axes = _by_layer(list(dict.fromkeys(layer for layer, _, _ in split)), split)
    axes.axhline(0.0, linestyle="--", color="grey", linewidth=1)
    return _finish(figure, axes, "held-out Pearson r (mean over targets)", title, path)


def _by_layer(layers: list[str], points: list[tuple[str, str, float]]):
    # a figure of one line per kind over the layers: points are (layer, kind, value)
    figure = _figure_class()(figsize=(max(4.0, 0.9 * len(layers) + 2.0), 3.6), dpi=100,
                             layout="constrained")
    axes = figure.add_subplot()
    for kind in dict.fromkeys(kind for _, kind, _ in points):
        mine = [(layers.index(layer), value) for layer, k, value in points if k == kind]
        axes.plot(*zip(*mine, strict=True), marker="o", label=kind)
    axes.set_xticks(range(len(layers)), layers, rotation=30 if len(layers) > 4 else 0,
                    ha="right" if len(layers) > 4 else "center")
    axes.set_xlabel("layer")
    axes.grid(alpha=0.3)
    return figure, axes


def _finish(figure, axes, ylabel: str, title: str | None, path: str | Path) -> Path:
    axes.set_ylabel(ylabel)
    axes.legend(fontsize="small")
    if title:
        axes.set_title(title, fontsize="medium")
    return _save(figure, path)


def can_plot(what: str) -> bool:
    """Whether matplotlib is there to draw ``what``; without it, a warning says how to get it."""
    if importlib.util.find_spec("matplotlib") is not None:
        return True
    log.warning("matplotlib is not installed, so no %s: pip install 'probe[viz]' (or pass "
                "plot=false)", what)
    return False


def _figure_class():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(
            "drawing the PNG needs matplotlib: pip install 'probe[viz]', or set plot=false"
        ) from None
    return Figure


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
    except OSError as err:
        raise OutputError(f"cannot write {str(path)!r} ({err.strerror or err}); choose a "
                          "writable folder") from None
    return path
