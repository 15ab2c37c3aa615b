"""open_clip models: ``model=open_clip model.name=ViT-B-32``.

``model.name`` is an open_clip architecture (``open_clip.list_models()``), or the path of a
model config JSON of one's own (registered with ``open_clip.add_model_config``, named by its
stem). ``model.weights``: null (random init, seeded by ``seed``, offline), a pretrained tag
(``laion2b_s34b_b79k``: open_clip's download cache, offline once cached), or the path of a
local state_dict. ``dataset.transform=auto`` is open_clip's own evaluation preprocessing and
``dataset.tokenizer=auto`` its own tokenizer (``open_clip.get_tokenizer``). Both towers as
Hugging Face's two-tower models (probe.families.towers): images run ``encode_image``,
image-text pairs (dataset=pairs) the whole model, with ``objective=similarity``. Needs the
``vision`` extra; runs of other models never import open_clip.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import Reduce
from probe.data.feed import Batch, DataKind, Feed
from probe.data.layouts import PatchGrid, RowLayout
from probe.errors import ConfigError, DataError
from probe.families import towers as two_towers
from probe.families.base import Family, graph_from
from probe.families.checkpoints import load_checkpoint, looks_like_path
from probe.families.registry import register

__all__ = ["open_clip_model", "OpenClipTokenizer", "FAMILY"]


def open_clip_model(name: str, weights: str | None = None, **options) -> nn.Module:
    """An open_clip model in eval mode.

    Args:
        name: an open_clip architecture, or the path of a model config JSON.
        weights: None (random init), a pretrained tag, or the path of a local state_dict.
        options: passed to ``open_clip.create_model`` (``+model.force_image_size=336``).

    Raises:
        ConfigError: open_clip is not installed, an unknown architecture or tag.
        DataError: the checkpoint does not exist, or pretrained weights are neither cached nor
            downloadable.
    """
    open_clip = _open_clip()
    architecture = _architecture(name)
    local = weights is not None and looks_like_path(str(weights))
    if weights is not None and not local:
        tags = open_clip.list_pretrained_tags_by_model(architecture)
        if str(weights) not in tags:
            raise ConfigError(f"model.weights={weights!r} is not a pretrained tag of {name}; use "
                              f"one of {', '.join(tags) or '(none)'}, null, or a state_dict path")
    try:
        model = open_clip.create_model(architecture, pretrained=None if local else weights,
                                       pretrained_text=False, **options)
    except TypeError as err:
        raise ConfigError(f"model.name={name!r}: {err}") from None
    except (OSError, RuntimeError) as err:
        if weights is None or local:
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(
            f"model.name={name!r} model.weights={weights}: open_clip could not load the weights "
            f"({first}); on a machine without internet, download them once where there is a "
            "network and copy the cache (~/.cache/huggingface, or $HF_HOME) here, or pass a "
            "local state_dict as model.weights") from None
    if local:
        load_checkpoint(model, str(weights))
    return model.eval()


class OpenClipTokenizer:
    """open_clip's own tokenizer as captions -> (ids, attention mask), at its context length
    (padding after the end-of-text token is 0)."""

    def __init__(self, name: str):
        self.name = name
        self.tokenizer = _open_clip().get_tokenizer(_architecture(name))

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.tokenizer(list(texts))
        return ids, (ids != 0).long()

    def __repr__(self) -> str:
        length = getattr(self.tokenizer, "context_length", None)
        return f"open_clip.get_tokenizer({self.name!r}) context_length={length}"


class OpenClipFamily(Family):
    """open_clip's two-tower models (see the module's docstring)."""

    name = "open_clip"
    libraries = ("open_clip",)
    reads = (DataKind.tensors, DataKind.pairs)
    towers = MappingProxyType({"vision": ("visual",),
                               "text": ("transformer", "token_embedding", "ln_final", "text")})

    def recognizes(self, model: nn.Module) -> bool:
        return type(model).__module__.startswith("open_clip.")

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        # the model's own preprocess (its size, mean and std, and a tag's), built without the
        # weights
        weights = model_cfg.get("weights")
        tag = None if weights is None or looks_like_path(str(weights)) else str(weights)
        _, _, preprocess = _open_clip().create_model_and_transforms(
            _architecture(model_cfg.name), pretrained=tag, load_weights=False,
            pretrained_text=False)
        return preprocess

    def tokenizer(self, model_cfg: DictConfig) -> Callable | None:
        return OpenClipTokenizer(str(model_cfg.name))

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        Family.check(self, model, feed, reduces)
        two_towers.check_layers(feed, reduces, self.towers)

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return (f"model=open_clip reads images and image-text pairs, not {feed.kind.value}: it "
                "runs its text tower on captions of its own tokenizer at its context length; "
                "use dataset=pairs (images with captions); dataset=text is for Hugging Face "
                "tokenizers")

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        inputs = batch.inputs
        pixels = inputs if isinstance(inputs, torch.Tensor) else inputs.get("pixel_values")
        visual = model.visual
        if pixels is None or not hasattr(visual, "grid_size"):
            return batch.layout
        grid = tuple(int(n) for n in visual.grid_size)
        layout = PatchGrid(int(getattr(visual, "class_embedding", None) is not None), grid)
        two_towers.check_pair_lengths(inputs, layout)
        return layout

    def forward(self, model: nn.Module, batch, *, input_grad: bool = False):
        inputs = batch.inputs
        if isinstance(inputs, torch.Tensor):
            return model.encode_image(inputs.requires_grad_() if input_grad else inputs)
        pixels = inputs["pixel_values"]
        # a custom text tower (open_clip's CustomTextCLIP) has no token_embedding of its own
        with graph_from(getattr(model, "token_embedding", None), input_grad):
            return model(pixels.requires_grad_() if input_grad else pixels, inputs["input_ids"])

    def logits(self, output) -> torch.Tensor | None:
        # the (B, B) image-text logits of a pairs batch, as open_clip's own loss makes them
        if isinstance(output, dict):
            output = (output["image_features"], output["text_features"], output["logit_scale"],
                      output.get("logit_bias"))
        if not isinstance(output, tuple):
            return None
        image, text, scale, *bias = output
        logits = scale * image @ text.T
        return logits + bias[0] if bias and bias[0] is not None else logits

    def objective(self, name: str, model: nn.Module) -> Callable:
        return two_towers.objective(name, self.logits)

    def example_batch(self, model: nn.Module):
        # an image and a caption at the context length: both towers run
        size = getattr(model.visual, "image_size", 224)
        size = (size, size) if isinstance(size, int) else tuple(size)
        return two_towers.example_pair(torch.zeros(1, 3, *size), int(model.context_length),
                                       int(model.vocab_size))


FAMILY = register(OpenClipFamily())


def _architecture(name) -> str:
    """The architecture that ``name`` names: a known one, or the stem of a config JSON of
    one's own, which is registered first.

    Raises:
        ConfigError: neither.
    """
    open_clip = _open_clip()
    name = str(name)
    if name.endswith(".json"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise DataError(f"model.name={name!r}: no such model config file")
        open_clip.add_model_config(path)
        return path.stem
    if name.startswith(("hf-hub:", "local-dir:")) or name in open_clip.list_models():
        return name
    close = difflib.get_close_matches(name, open_clip.list_models(), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"model.name={name!r} is not an open_clip architecture.{hint} "
                      "open_clip.list_models() lists them; a config of one's own is passed as "
                      "the path of its JSON file")


def _open_clip():
    try:
        import open_clip
    except ImportError:
        raise ConfigError("model=open_clip needs open_clip: pip install 'probe[vision]'") from None
    return open_clip
