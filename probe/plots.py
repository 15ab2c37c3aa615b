"""PNG figures of results: probe accuracy by layer, and a Grad-CAM montage.

matplotlib is imported here only, inside the functions, so the rest of probe never needs it
(``pip install 'probe[viz]'``). Figures are drawn without pyplot, so no display is ever needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from probe.errors import ConfigError, OutputError

__all__ = ["plot_accuracy", "gradcam_montage"]


def plot_accuracy(results: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Held-out accuracy by layer, one line per kind, with the chance level dashed.

    Args:
        results: rows of ``probe.fit.fit_probes``, layers in file order.
        path: the PNG to write.
        title: drawn above the axes.

    Raises:
        ConfigError: matplotlib is not installed.
        OutputError: the PNG cannot be written.
    """
    figure_class = _figure_class()
    layers = list(dict.fromkeys(r["layer"] for r in results))
    kinds = list(dict.fromkeys(r["kind"] for r in results))
    figure = figure_class(figsize=(max(4.0, 0.9 * len(layers) + 2.0), 3.6), dpi=100,
                          layout="constrained")
    axes = figure.add_subplot()
    for kind in kinds:
        rows = [r for r in results if r["kind"] == kind]
        axes.plot([layers.index(r["layer"]) for r in rows], [r["accuracy"] for r in rows],
                  marker="o", label=kind)
    chance = [max(r["chance"] for r in results if r["layer"] == layer) for layer in layers]
    axes.plot(range(len(layers)), chance, linestyle="--", color="grey",
              label="chance (majority class)")
    axes.set_xticks(range(len(layers)), layers, rotation=30 if len(layers) > 4 else 0,
                    ha="right" if len(layers) > 4 else "center")
    axes.set_ylim(0, 1.02)
    axes.set_ylabel("held-out accuracy")
    axes.set_xlabel("layer")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    if title:
        axes.set_title(title, fontsize="medium")
    return _save(figure, path)


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
