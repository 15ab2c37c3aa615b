"""Hugging Face models by name or folder: ``model=transformers model.name=gpt2``.

The model is built with transformers' own Auto classes, with the key/value cache off (nobody
needs it while probing) and in eval mode. ``weights=pretrained`` loads the weights with
``from_pretrained`` (the Hub cache, so it works offline once cached, and honours
``HF_HUB_OFFLINE``); ``weights=null`` initialises them from the model's config, seeded by
``seed``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError
from probe.families import Family, TokenLayout, register

__all__ = ["transformers_model", "head_of", "require_head", "HEADS", "nll", "FAMILY", "source_of",
           "CaptionTokenizer"]

log = logging.getLogger(__name__)

# model.head -> the Auto class that builds it
HEADS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
         "sequence_classification": "AutoModelForSequenceClassification",
         "image_classification": "AutoModelForImageClassification",
         "ctc": "AutoModelForCTC", "audio_classification": "AutoModelForAudioClassification",
         "base": "AutoModel"}
# a checkpoint's main input (its class's ``main_input_name``) -> the module whose FAMILY
# serves it; checkpoints that read token ids are served by this module's own family
_BY_INPUT = {"pixel_values": "probe.families.hf_vision",
             "input_values": "probe.families.hf_audio",
             "input_features": "probe.families.hf_audio"}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    for key, value, allowed in (("head", head, (*HEADS, "auto")), ("dtype", dtype, _DTYPES),
                                ("weights", weights, ("pretrained", None))):
        if value not in allowed:
            choices = ", ".join("null" if a is None else a for a in allowed)
            raise ConfigError(f"model.{key}={value!r} is unknown; use one of {choices}")
    source = _source(str(name))
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
            model = _quietly_loaded(auto, str(name), source, config=config, dtype=_DTYPES[dtype],
                                    device_map=_plain(device_map),
                                    offload_folder=offload_folder, **options)
        else:
            model = (auto.from_config(config, **options) if hasattr(auto, "from_config")
                     else auto._from_config(config)).to(_DTYPES[dtype])  # a named class
    except OSError as err:
        raise _unavailable(str(name), source, err) from None
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


def source_of(name: str) -> str:
    """Where transformers loads ``model.name`` from: the folder, or the Hub id.

    Raises:
        DataError: a path that is not a folder that save_pretrained wrote.
    """
    return _source(str(name))


def _plain(device_map):
    # a map given in the config arrives as a DictConfig; transformers wants a dict
    return dict(device_map) if hasattr(device_map, "items") else device_map


def require_head(model: nn.Module, objective: str, heads: tuple[str, ...]) -> None:
    """Refuse ``objective`` on a model whose head is not one of ``heads``.

    Raises:
        ConfigError: naming the heads it needs and the one the model has.
    """
    head = head_of(model)
    if head not in heads:
        raise ConfigError(
            f"objective={objective} needs model.head={' or '.join(heads)}, but the model has "
            f"{'no head' if head == 'base' else f'head {head}'} ({type(model).__name__})")


def head_of(model: nn.Module) -> str:
    """Which head a transformers model carries (one of HEADS), from its class name."""
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if name.endswith("ForMaskedLM"):
        return "masked_lm"
    for suffix, head in (("ForSequenceClassification", "sequence_classification"),
                         ("ForImageClassification", "image_classification"),
                         ("ForCTC", "ctc"), ("ForAudioClassification", "audio_classification")):
        if name.endswith(suffix):
            return head
    return "base"


def _source(name: str) -> str:
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise DataError(f"model.name={name!r} is a folder without config.json; pass a folder "
                            "that save_pretrained wrote, or a Hub id")
        return str(path)
    if name.startswith(("/", "./", "../", "~")):
        raise DataError(f"model.name={name!r}: no such folder; pass a folder that "
                        "save_pretrained wrote, or a Hub id such as gpt2")
    return name


def _unavailable(name: str, source: str, err: OSError) -> DataError:
    if Path(source).exists():
        first = str(err).strip().splitlines()[0]
        return DataError(f"model.name={name!r}: cannot load it ({first})")
    return DataError(
        f"model.name={name!r} is neither a folder nor in the Hugging Face cache, and the Hub "
        "could not be reached; to use it offline, download it once where there is a network "
        f"(huggingface-cli download {name}) and copy the cache (~/.cache/huggingface, or "
        "$HF_HOME) to this machine, or save it with save_pretrained and pass that folder as "
        "model.name (set HF_HUB_OFFLINE=1 to fail at once instead of retrying)"
    )


class TransformersFamily(Family):
    """Language models: fed token ids with an attention mask, their (B, L, ...) outputs are
    token layouts whose real positions the batch marks, their logits in ``output.logits``."""

    name = "transformers"
    libraries = ("transformers",)

    def recognizes(self, model: nn.Module) -> bool:
        # transformers is only imported by runs that use it
        library = sys.modules.get("transformers")
        return library is not None and isinstance(model, library.PreTrainedModel)

    def specialise(self, model: nn.Module) -> Family:
        family = _sibling(_main_input(type(model)))
        return self if family is None or family is self else family.specialise(model)

    def transform(self, model_cfg) -> Callable | None:
        # the checkpoint's own preprocessing, from the family that serves what it reads: its
        # config names its class, whose main input says which (no model is built for this)
        import transformers

        options = {"trust_remote_code": bool(model_cfg.get("trust_remote_code", False))}
        try:
            config = transformers.AutoConfig.from_pretrained(source_of(model_cfg.name), **options)
        except OSError as err:
            raise _unavailable(str(model_cfg.name), str(model_cfg.name), err) from None
        classes = [getattr(transformers, str(n), None) for n in config.architectures or ()]
        inputs = {_main_input(c) for c in classes if isinstance(c, type)}
        for family in filter(None, map(_sibling, sorted(inputs))):
            if family is not self:
                return family.transform(model_cfg)
        return None

    def tokenizer(self, model_cfg) -> Callable | None:
        return CaptionTokenizer(str(model_cfg.name),
                                trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))

    def place(self, model: nn.Module, device: torch.device, asked: str
              ) -> tuple[nn.Module, torch.device]:
        # spread over devices by a device map (device_map=auto), a model stays as it is, and
        # its inputs go where its input embeddings live
        if not getattr(model, "hf_device_map", None):
            return model.to(device), device
        if str(asked) != "auto":
            raise ConfigError(f"device={asked} but model.device_map already places the model; "
                              "leave device=auto")
        return model, model.get_input_embeddings().weight.device

    def check_data(self, model: nn.Module, feed) -> None:
        if feed.kind != "text":
            raise ConfigError(
                f"{type(model).__name__} is a language model: it reads text, not these inputs; "
                "add dataset=text dataset.path=<a .txt, .jsonl, .csv or .parquet file> (or "
                "dataset=tokens dataset.path=<token ids>)")

    def token_layout(self, model: nn.Module, batch) -> TokenLayout | None:
        if batch.keep is None:
            return None
        return TokenLayout(batch.keep.shape[1], keep=batch.keep)

    def forward(self, model: nn.Module, batch, *, input_grad: bool = False):
        # token ids have no gradient: the graph starts at the input embeddings instead
        handle = (model.get_input_embeddings().register_forward_hook(_start_graph)
                  if input_grad else None)
        try:
            return model(**batch.inputs)
        finally:
            if handle is not None:
                handle.remove()

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def objective(self, name: str, model: nn.Module) -> Callable:
        named = {"nll": (nll, ("causal_lm",)),
                 "top1": (top1, ("causal_lm", "masked_lm", "sequence_classification")),
                 "target": (target, ("sequence_classification",))}
        if name not in named:
            raise ConfigError(f"objective={name!r} is unknown for a language model; use nll, "
                              "top1, target, or a config with a _target_ callable (logits, "
                              "targets) -> one value per sample")
        function, heads = named[name]
        require_head(model, name, heads)
        return lambda output, batch: function(self._required_logits(output), batch)

    def example_batch(self, model: nn.Module):
        from probe.feeds import Batch

        # a few tokens of the model's own vocabulary: listing layers needs no corpus
        ids = (torch.arange(8) % model.get_input_embeddings().num_embeddings).view(1, -1)
        return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                     {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                     keep=torch.ones(ids.shape, dtype=torch.bool))

    # the heads whose logits objectives differentiate, for the message when a model has none
    logit_heads = "causal_lm, masked_lm or sequence_classification"

    def _required_logits(self, output) -> torch.Tensor:
        logits = self.logits(output)
        if logits is None:
            raise ConfigError("the model returns no logits (model.head=base?); use model.head="
                              f"{self.logit_heads} for gradients")
        return logits


FAMILY = register(TransformersFamily())


class CaptionTokenizer:
    """A checkpoint's own tokenizer (``AutoTokenizer`` from the same folder or Hub id) as
    captions -> (ids, attention mask), padded to one length: the text model's positions (CLIP
    77, SigLIP 64, as they were trained), or the tokenizer's own limit where that is smaller.

    Raises:
        DataError: the checkpoint has no tokenizer.
    """

    def __init__(self, name: str, trust_remote_code: bool = False):
        import transformers

        self.name = name
        source = _source(name)
        options = {"trust_remote_code": trust_remote_code}
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(source, **options)
            config = transformers.AutoConfig.from_pretrained(source, **options)
        except (OSError, ValueError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(f"model.name={name!r} has no tokenizer that AutoTokenizer can load "
                            f"({first}); save one beside the weights") from None
        text = getattr(config, "text_config", None) or config
        limits = [getattr(text, "max_position_embeddings", None),
                  getattr(self.tokenizer, "model_max_length", None)]
        self.max_length = min(int(n) for n in limits if n is not None and 0 < n < 1_000_000)

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        made = self.tokenizer(list(texts), padding="max_length", truncation=True,
                              max_length=self.max_length, return_tensors="pt")
        ids = made["input_ids"]
        return ids, made.get("attention_mask", torch.ones_like(ids))

    def __repr__(self) -> str:
        return f"{type(self.tokenizer).__name__}({self.name!r}, max_length={self.max_length})"


def _main_input(cls: type) -> str:
    # a two-tower model (CLIP, SigLIP: image and text features) names input_ids as its main
    # input, but is served with the vision models: an image dataset feeds its vision tower
    if callable(getattr(cls, "get_image_features", None)) and \
            callable(getattr(cls, "get_text_features", None)):
        return "pixel_values"
    return getattr(cls, "main_input_name", "input_ids")


def _sibling(main_input: str) -> Family | None:
    """The FAMILY of the module that serves checkpoints reading ``main_input``; None for token
    ids (this module's own)."""
    module = _BY_INPUT.get(main_input)
    return None if module is None else importlib.import_module(module).FAMILY


def nll(logits: torch.Tensor, batch) -> torch.Tensor:
    """Each sample's mean next-token negative log-likelihood over its real tokens (0 for a
    sample of one token, which predicts nothing)."""
    ids = batch.inputs["input_ids"][:, 1:]
    mask = batch.inputs["attention_mask"]
    counted = (mask[:, 1:] * mask[:, :-1]).float()  # predictions from a real token of a real one
    losses = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2).float(), ids,
                                         reduction="none")
    return (losses * counted).sum(1) / counted.sum(1).clamp_min(1)


def top1(logits: torch.Tensor, batch) -> torch.Tensor:
    """The largest logit: at each sample's last real token, or of a classification head."""
    if logits.dim() == 3:
        last = batch.inputs["attention_mask"].sum(1) - 1
        logits = logits[torch.arange(len(logits), device=logits.device), last]
    return logits.amax(1)


def target(logits: torch.Tensor, batch) -> torch.Tensor:
    """The logit of each sample's label, from a classification head."""
    return logits.gather(1, batch.target.to(logits.device).view(-1, 1)).squeeze(1)


def _start_graph(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    # a leaf that requires grad: every path from the input embeddings is then in the graph
    return output.detach().requires_grad_()
