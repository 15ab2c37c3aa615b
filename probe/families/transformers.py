"""Hugging Face models by name or folder: ``model=transformers model.name=gpt2``.

The model is built with transformers' own Auto classes, with the key/value cache off (nobody
needs it while probing) and in eval mode. ``weights=pretrained`` loads the weights with
``from_pretrained`` (the Hub cache, so it works offline once cached, and honours
``HF_HUB_OFFLINE``); ``weights=null`` initialises them from the model's config, seeded by
``seed``.

This module's family serves language models (token ids in, a row per real token out). A
checkpoint whose class reads pixels (or has two towers) is served by probe.families.hf_vision,
one that reads sound by probe.families.hf_audio: ``specialise`` hands it on in one step, by
the class's main input.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import Dtype
from probe.data.feed import Batch, DataKind, Feed, ModelLimits
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.families import hf_audio, hf_video, hf_vision, hf_vlm
from probe.families.base import Family, graph_from
from probe.families.hf_attention import eager_patterns
from probe.families.hf_generation import generate, nll, top1
from probe.families.hf_heads import attention_heads
from probe.families.hf_names import hf_names
from probe.families.hf_seq2seq import (
    decoded_layout,
    generate_decoded,
    is_encoder_decoder,
    with_decoder_start,
)
from probe.families.hf_verify import verify_run
from probe.families.hub import (
    HEADS,
    CaptionTokenizer,
    place,
    require_head,
    required_logits,
    source_of,
    target,
    tokenizer_of,
    unavailable,
)
from probe.families.registry import register

__all__ = ["transformers_model", "nll", "FAMILY"]

log = logging.getLogger(__name__)


def transformers_model(name: str, weights: str | None = "pretrained", head: str = "auto",
                       dtype: str = "float32", trust_remote_code: bool = False,
                       device_map: str | dict | None = None,
                       offload_folder: str | None = None) -> nn.Module:
    """A transformers model in eval mode, its key/value cache off.

    Args:
        name: a Hub id (``gpt2``, ``meta-llama/Llama-3.2-1B``) or a folder saved with
            ``save_pretrained``.
        weights: ``pretrained`` (from_pretrained) or None (random init from the config).
        head: ``auto`` (the class that the checkpoint's config names in ``architectures``;
            without one, causal_lm for a language model, else base), causal_lm, masked_lm,
            sequence_classification, image_classification, ctc, audio_classification, or base
            (no head).
        dtype: float32, bfloat16 or float16.
        trust_remote_code: run the model's own code from the Hub (off unless set).
        device_map: ``auto`` spreads a model larger than one device over the GPUs of the node
            (then CPU memory), through accelerate, as ``from_pretrained`` does; or an explicit
            {module: device} map. None: the whole model on the run's ``device``.
        offload_folder: where a device map's ``disk`` modules keep their weights.

    Raises:
        ConfigError: an unknown head, dtype or weights value.
        DataError: a folder that does not exist, or a Hub id that is neither cached nor
            reachable (the message says how to make it available offline).
    """
    import transformers

    transformers.utils.logging.disable_progress_bar()
    model_dtypes = tuple(d for d in Dtype.__members__ if d != "float8")  # float8: output only
    for key, value, allowed in (("head", head, (*HEADS, "auto")),
                                ("dtype", dtype, model_dtypes),
                                ("weights", weights, ("pretrained", None))):
        if value not in allowed:
            choices = ", ".join("null" if a is None else a for a in allowed)
            raise ConfigError(f"model.{key}={value!r} is unknown; use one of {choices}")
    source = source_of(name)
    options = {"trust_remote_code": bool(trust_remote_code)}
    if device_map is not None:
        if weights != "pretrained":
            raise ConfigError("model.device_map places pretrained weights as they load; it needs "
                              "model.weights=pretrained")
        try:
            import accelerate  # noqa: F401  (from_pretrained places the model through it)
        except ImportError:
            raise ConfigError("model.device_map needs accelerate: pip install 'probe[text]'") \
                from None
    try:
        config = transformers.AutoConfig.from_pretrained(source, **options)
        auto = _model_class(transformers, config, head)
        if weights == "pretrained":
            model = _quietly_loaded(auto, str(name), source, config=config,
                                    dtype=Dtype[dtype].torch, device_map=_plain(device_map),
                                    offload_folder=offload_folder, **options)
        else:
            model = (auto.from_config(config, **options) if hasattr(auto, "from_config")
                     else auto._from_config(config)).to(Dtype[dtype].torch)  # a named class
    except OSError as err:
        raise unavailable(str(name), source, err) from None
    except ValueError as err:  # a config that this Auto class cannot build
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"model.name={name!r} with model.head={head}: {first}") from None
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.eval()


def _model_class(transformers, config, head: str):
    """The class that builds ``head``; for ``auto``, the one that the config's architectures
    names, else what ``causal_lm`` (the former default) gave a language model, else AutoModel."""
    if head != "auto":
        return getattr(transformers, HEADS[head])
    for name in getattr(config, "architectures", None) or ():
        found = getattr(transformers, str(name), None)
        if isinstance(found, type) and issubclass(found, transformers.PreTrainedModel):
            return found
    causal = transformers.AutoModelForCausalLM
    known = getattr(causal, "_model_mapping", {})
    return causal if type(config) in known else transformers.AutoModel


def _quietly_loaded(auto, name: str, source: str, **options) -> nn.Module:
    """``auto.from_pretrained``, its load report (a table of weights that the checkpoint lacks
    or that the class leaves out) said in one warning line instead."""
    import transformers

    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        model, info = auto.from_pretrained(source, output_loading_info=True, **options)
    finally:
        transformers.utils.logging.set_verbosity(verbosity)
    new, unused = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    if new or unused:
        said = [f"{len(new)} newly initialised ({_some(new)})" if new else "",
                f"{len(unused)} in the checkpoint left unused ({_some(unused)})" if unused else ""]
        log.warning("model.name=%s as %s: weights %s", name, type(model).__name__,
                    "; ".join(s for s in said if s))
    return model


def _some(keys: list[str], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (", ..." if len(keys) > shown else "")


def _plain(device_map):
    # a map given in the config arrives as a DictConfig; transformers wants a dict
    return dict(device_map) if hasattr(device_map, "items") else device_map


class TransformersFamily(Family):
    """Language models: fed token ids with an attention mask, their (B, L, ...) outputs follow
    the feed's layout of real tokens, their logits in ``output.logits``."""

    name = "transformers"
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    libraries = ("transformers",)
    reads = (DataKind.text,)
    place = staticmethod(place)  # a device map may spread the model (probe.families.hub)

    def recognizes(self, model: nn.Module) -> bool:
        # transformers is only imported by runs that use it
        library = sys.modules.get("transformers")
        return library is not None and isinstance(model, library.PreTrainedModel)

    def specialise(self, model: nn.Module) -> Family:
        return _served_by(type(model)) or self

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        # the checkpoint's own preprocessing, from the family that serves what it reads
        served = _served_by_config(model_cfg)
        return None if served is None else served.transform(model_cfg)

    def tokenizer(self, model_cfg: DictConfig) -> Callable | None:
        served = _served_by_config(model_cfg)
        if served is not None and served.reads == (DataKind.pairs,):  # a processor's prompts
            return served.tokenizer(model_cfg)
        return CaptionTokenizer(str(model_cfg.name),
                                trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))

    def detokenizer(self, model_cfg: DictConfig) -> Callable[[list[list[int]]], list[str]]:
        tokenizer = tokenizer_of(str(model_cfg.name),
                                 bool(model_cfg.get("trust_remote_code", False)))
        return lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return (f"{type(model).__name__} is a language model: it reads text, not these inputs; "
                "add dataset=text dataset.path=<a .txt, .jsonl, .csv or .parquet file> (or "
                "dataset=tokens dataset.path=<token ids>)")

    def input_limits(self, model: nn.Module) -> ModelLimits:
        # Positions are a limit where they are learned: an embedding of max_position_embeddings
        # rows (GPT-2's wpe, BERT's) fails past its end; rotary positions (Llama, Qwen) do not.
        embeddings = model.get_input_embeddings()
        positions = getattr(model.config, "max_position_embeddings", None)
        learned = positions is not None and any(
            isinstance(m, nn.Embedding) and m is not embeddings and m.num_embeddings == positions
            for m in model.modules())
        return ModelLimits(positions=int(positions) if learned else None,
                           vocabulary=int(embeddings.num_embeddings), model=type(model).__name__)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        # token ids have no gradient: the graph starts at the input embeddings instead
        with graph_from(model.get_input_embeddings(), input_grad):
            return model(**with_decoder_start(model, batch.inputs))

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        # an encoder-decoder's: its decoder's rows are its target's (probe.families.hf_seq2seq)
        return decoded_layout(model, batch, batch.layout)

    @staticmethod
    def generate(model: nn.Module, inputs: dict, settings, all_logits: bool = False):
        if is_encoder_decoder(model):  # its answer is its decoder's (probe.families.hf_seq2seq)
            return generate_decoded(model, inputs, settings)
        return generate(model, inputs, settings, all_logits)  # probe.families.hf_generation

    @staticmethod
    def decodes_answers(model: nn.Module) -> bool:
        return is_encoder_decoder(model)  # probe.families.hf_seq2seq
    heads = staticmethod(attention_heads)  # do: heads (probe.families.hf_heads)

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def objective(self, name: str, model: nn.Module) -> Callable:
        named = {"nll": (nll, ("causal_lm", "seq2seq_lm")),  # seq2seq: fed a target
                 "top1": (top1, ("causal_lm", "masked_lm", "sequence_classification")),
                 "target": (target, ("sequence_classification",))}
        if name not in named:
            raise ConfigError(f"objective={name!r} is unknown for a language model; use nll, "
                              "top1, target, or a config with a _target_ callable (logits, "
                              "targets) -> one value per sample")
        function, heads = named[name]
        require_head(model, name, heads)
        return lambda output, batch: function(
            required_logits(output, "causal_lm, masked_lm or sequence_classification"), batch)

    def example_batch(self, model: nn.Module) -> Batch:
        # a few tokens of the model's own vocabulary: listing layers needs no corpus
        from probe.data.layouts import Positions

        ids = (torch.arange(8) % model.get_input_embeddings().num_embeddings).view(1, -1)
        return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                     {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                     layout=Positions(torch.ones(ids.shape, dtype=torch.bool)))


FAMILY = register(TransformersFamily())


def _served_by(cls: type) -> Family | None:
    """The family of the sibling module that serves checkpoints of class ``cls``: a
    vision-language model (its main input is input_ids, with images), a two-tower model (image
    and text features; an image dataset feeds its vision tower), or one that reads pixels or
    sound, or video; None for token ids (this module's)."""
    if hf_vlm.is_vision_language(cls):
        return hf_vlm.VISION_LANGUAGE
    if hf_vision.is_two_tower(cls):
        return hf_vision.TWO_TOWERS
    if hf_video.is_video(cls):
        return hf_video.VIDEO
    return {"pixel_values": hf_vision.VISION, "input_values": hf_audio.AUDIO,
            "input_features": hf_audio.AUDIO}.get(getattr(cls, "main_input_name", "input_ids"))


def _served_by_config(model_cfg: DictConfig) -> Family | None:
    """The family that serves the checkpoint ``model_cfg`` names, from its config's classes
    (no model is built for this); None for a language model (this module's)."""
    import transformers

    options = {"trust_remote_code": bool(model_cfg.get("trust_remote_code", False))}
    try:
        config = transformers.AutoConfig.from_pretrained(source_of(model_cfg.name), **options)
    except OSError as err:
        raise unavailable(str(model_cfg.name), str(model_cfg.name), err) from None
    classes = [getattr(transformers, str(n), None) for n in config.architectures or ()]
    served = [_served_by(c) for c in classes if isinstance(c, type)]
    return next((family for family in served if family is not None), None)
