"""What two-tower image-text models share, whatever their library (Hugging Face's CLIP and
SigLIP, open_clip's): which tower a layer belongs to, the refusal of a layer in a tower that
the data does not feed, and ``objective=similarity``, each pair's matched image-text logit.

The data says which tower runs: images feed the vision tower, text the text tower, image-text
pairs (probe.data.pairs) both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from probe.config.schema import Reduce
from probe.data.feed import Batch, DataKind, Feed
from probe.data.layouts import RowLayout
from probe.errors import ConfigError

__all__ = ["is_two_tower", "fed_towers", "tower_of", "check_layers", "check_pair_lengths",
           "objective", "similarity", "example_pair"]


def is_two_tower(cls: type) -> bool:
    """Whether a model class has an image tower and a text tower (image and text features)."""
    return (callable(getattr(cls, "get_image_features", None))
            and callable(getattr(cls, "get_text_features", None)))


_FED = {DataKind.pairs: ("vision", "text"), DataKind.text: ("text",),
        DataKind.tensors: ("vision",)}


def fed_towers(feed: Feed) -> tuple[str, ...]:
    """The towers that a dataset's feed runs."""
    return _FED.get(feed.kind, ("vision",))


def tower_of(layer: str, towers: Mapping[str, tuple[str, ...]]) -> str | None:
    """The tower that ``layer`` belongs to (``towers``: each tower's top-level module names);
    None for a module of neither (the whole model)."""
    return next((name for name, roots in towers.items()
                 if any(layer == root or layer.startswith(f"{root}.") for root in roots)), None)


def check_layers(feed: Feed, reduces: Mapping[str, Reduce],
                 towers: Mapping[str, tuple[str, ...]]) -> None:
    """Refuse a layer of a tower that the data does not run (``towers``: each tower's
    top-level module names), and, in a pairs run, a reduce of a text-tower layer: its
    (N, length, D) outputs are stored whole, and a reduce would pool their features.

    Raises:
        ConfigError: naming the layer, its tower, and the tower the data feeds.
    """
    fed = fed_towers(feed)
    for layer, reduce in reduces.items():
        tower = tower_of(layer, towers)
        if tower is not None and tower not in fed:
            data = {"text": "text (a text dataset)", "vision": "images"}[fed[0]]
            raise ConfigError(
                f"layer {layer} is in the {tower} tower, but this dataset feeds {data}, which "
                f"runs the {fed[0]} tower only; pick layers of the {fed[0]} tower, or use "
                "dataset=pairs (images with captions) to run both")
        if len(fed) > 1 and tower == "text" and reduce in (Reduce.mean, Reduce.max):
            raise ConfigError(
                f"reduce={reduce.name} on {layer}: in a pairs run the text tower's outputs are "
                "stored whole, (N, length, features), and it would pool the features; leave "
                f"this layer out of the reduce ('reduce_by_layer={{{layer}:none}}'), or pool "
                "its tokens with dataset=text tokens=mean")


def check_pair_lengths(inputs, layout: RowLayout) -> None:
    """Refuse pairs whose padded captions are exactly as long as the image's tokens: a batch
    has one row layout (the image's), and the text tower's (B, length, D) outputs would be
    taken for one.

    Raises:
        ConfigError: saying so.
    """
    if isinstance(inputs, dict) and "input_ids" in inputs \
            and inputs["input_ids"].shape[1] == layout.length:
        raise ConfigError(f"dataset=pairs: the captions' padded length equals the image's "
                          f"{layout.length} tokens, so text-tower outputs would be read as "
                          "image tokens; run the towers apart (an image dataset, dataset=text)")


def similarity(logits_per_image: torch.Tensor) -> torch.Tensor:
    """Each pair's matched logit: image i with caption i, the diagonal of the (B, B) logits.
    Pair i's value depends on its own image and caption only, so its gradients are its own."""
    return logits_per_image.diagonal()


def objective(name: str, logits_of: Callable) -> Callable:
    """The objective ``name`` of a two-tower model, as (output, batch) -> (B,) values;
    ``logits_of`` reads the (B, B) image-text logits from the output (None: only one tower
    ran).

    Raises:
        ConfigError: a name other than similarity.
    """
    if name != "similarity":
        raise ConfigError(f"objective={name} needs class logits, which a two-tower model does not "
                          "give; use objective=similarity (each pair's image-text logit) with "
                          "dataset=pairs, or a _target_ callable")

    def matched(output, batch) -> torch.Tensor:
        logits = logits_of(output)
        if logits is None:
            raise ConfigError("objective=similarity is the matched image-text logit: it needs "
                              "both towers, fed by dataset=pairs dataset.path=<csv or jsonl of "
                              "image paths and captions>")
        return similarity(logits)

    return matched


def example_pair(pixels: torch.Tensor, length: int, vocab: int):
    """A batch of one image (``pixels``, (1, C, H, W)) and one caption of ``length`` token ids
    of the model's vocabulary: both towers run, for listing their layers without data."""
    ids = (torch.arange(length) % vocab).view(1, -1)
    return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                 {"pixel_values": pixels, "input_ids": ids, "attention_mask": torch.ones_like(ids)})
