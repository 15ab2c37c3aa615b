"""timm models by name: ``model=timm model.name=vit_base_patch16_224``.

Weights: null (random init, seeded by ``seed``, offline), ``pretrained`` (timm's weights
through the Hugging Face cache: offline once cached), or the path of a local state_dict. Needs
the ``timm`` extra; runs of other models never import timm.
"""

from __future__ import annotations

import difflib

from torch import nn

from probe.errors import ConfigError, DataError
from probe.models import _looks_like_path, load_checkpoint

__all__ = ["timm_model"]


def timm_model(name: str, weights: str | None = None, **options) -> nn.Module:
    """A timm model in eval mode.

    Args:
        name: any ``timm.list_models()`` name, with a pretrained tag or without
            (``vit_base_patch16_clip_224.openai``).
        weights: None (random init), ``pretrained``, or the path of a local state_dict.
        options: passed to ``timm.create_model`` (``+model.img_size=384``,
            ``+model.num_classes=0``).

    Raises:
        ConfigError: timm is not installed, or the name (or weights value) is unknown.
        DataError: the checkpoint does not exist, or pretrained weights are neither cached nor
            downloadable.
    """
    timm = _timm()
    name = str(name)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"model.name={name!r} is not a timm model.{hint} "
                          "timm.list_models('*vit*') lists them by pattern.")
    if weights not in (None, "pretrained") and not _looks_like_path(str(weights)):
        raise ConfigError(f"model.weights={weights!r}: use null (random init), pretrained, or "
                          "the path of a local state_dict")
    try:
        model = timm.create_model(name, pretrained=weights == "pretrained", **options)
    except TypeError as err:  # an option the model does not take
        raise ConfigError(f"model.name={name!r}: {err}") from None
    except (OSError, RuntimeError) as err:
        if weights != "pretrained":
            raise
        first = str(err).strip().splitlines()[0]
        raise DataError(
            f"model.name={name!r} model.weights=pretrained: timm could not load the weights "
            f"({first}); on a machine without internet, download them once where there is a "
            "network and copy the Hugging Face cache (~/.cache/huggingface, or $HF_HOME) here, "
            "or pass a local state_dict as model.weights"
        ) from None
    if weights not in (None, "pretrained"):
        load_checkpoint(model, str(weights))
    return model.eval()


def _timm():
    try:
        import timm
    except ImportError:
        raise ConfigError("model=timm needs timm: pip install 'probe[timm]'") from None
    return timm
