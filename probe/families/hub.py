"""What the Hugging Face families share (probe.families.transformers, .hf_vision, .hf_audio):
where a checkpoint is, what it cannot load, which head a model has, a model spread over
devices, the checkpoint's tokenizer, and the objectives of class logits.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from probe.errors import ConfigError, DataError

__all__ = ["HEADS", "ProcessorTransform", "source_of", "tokenizer_of", "unavailable", "head_of",
           "require_head", "place", "required_logits", "target", "CaptionTokenizer"]

log = logging.getLogger(__name__)

# model.head -> the Auto class that builds it
HEADS = {"causal_lm": "AutoModelForCausalLM", "masked_lm": "AutoModelForMaskedLM",
         "sequence_classification": "AutoModelForSequenceClassification",
         "image_classification": "AutoModelForImageClassification",
         "ctc": "AutoModelForCTC", "audio_classification": "AutoModelForAudioClassification",
         "image_text_to_text": "AutoModelForImageTextToText", "base": "AutoModel"}


def source_of(name: str) -> str:
    """Where transformers loads ``model.name`` from: the folder, or the Hub id.

    Raises:
        DataError: a path that is not a folder that save_pretrained wrote.
    """
    name = str(name)
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


def unavailable(name: str, source: str, err: OSError) -> DataError:
    """The line for a checkpoint that transformers could not load."""
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


def head_of(model: nn.Module) -> str:
    """Which head a transformers model carries (one of HEADS), from its class name."""
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if name.endswith("ForMaskedLM"):
        return "masked_lm"
    for suffix, head in (("ForSequenceClassification", "sequence_classification"),
                         ("ForImageClassification", "image_classification"),
                         ("ForCTC", "ctc"), ("ForAudioClassification", "audio_classification"),
                         # an encoder-decoder's language-model head (no model.head builds it)
                         ("ForConditionalGeneration", "seq2seq_lm"), ("MTModel", "seq2seq_lm")):
        if name.endswith(suffix):
            return head
    return "base"


def require_head(model: nn.Module, objective: str, heads: tuple[str, ...]) -> None:
    """Refuse ``objective`` on a model whose head is not one of ``heads``.

    Raises:
        ConfigError: naming the heads it needs and the one the model has.
    """
    head = head_of(model)
    if head not in heads:
        settable = [h for h in heads if h in HEADS] or heads  # what model.head can build
        raise ConfigError(
            f"objective={objective} needs model.head={' or '.join(settable)}, but the model has "
            f"{'no head' if head == 'base' else f'head {head}'} ({type(model).__name__})")


def place(model: nn.Module, device: torch.device, asked: str
          ) -> tuple[nn.Module, torch.device]:
    """``Family.place`` of a model that a device map may spread over devices (device_map=auto):
    it stays as it is, and its inputs go where its input embeddings live.

    Raises:
        ConfigError: a device asked for beside a device map.
    """
    if not getattr(model, "hf_device_map", None):
        return model.to(device), device
    if str(asked) != "auto":
        raise ConfigError(f"device={asked} but model.device_map already places the model; "
                          "leave device=auto")
    return model, model.get_input_embeddings().weight.device


def required_logits(output, heads: str) -> torch.Tensor:
    """``output.logits``, or the line that says which ``heads`` give them.

    Raises:
        ConfigError: the model returns no logits.
    """
    logits = getattr(output, "logits", None)
    if logits is None:
        raise ConfigError("the model returns no logits (model.head=base?); use model.head="
                          f"{heads} for gradients")
    return logits


def target(logits: torch.Tensor, batch) -> torch.Tensor:
    """The logit of each sample's label, from a classification head."""
    return logits.gather(1, batch.target.to(logits.device).view(-1, 1)).squeeze(1)


def tokenizer_of(name: str, trust_remote_code: bool = False):
    """The checkpoint's own tokenizer (``AutoTokenizer`` from the same folder or Hub id).

    Raises:
        DataError: the checkpoint has none.
    """
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(source_of(name),
                                                          trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DataError(f"model.name={name!r} has no tokenizer that AutoTokenizer can load "
                        f"({first}); save one beside the weights") from None


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
        self.tokenizer = tokenizer_of(name, trust_remote_code)
        config = transformers.AutoConfig.from_pretrained(source_of(name),
                                                         trust_remote_code=trust_remote_code)
        text = getattr(config, "text_config", None) or config
        limits = [getattr(text, "max_position_embeddings", None),
                  getattr(self.tokenizer, "model_max_length", None)]
        self.max_length = min(int(n) for n in limits if n is not None and 0 < n < 1_000_000)
        if self.tokenizer.pad_token is None:
            # captions are padded to one length, masked; what the padding holds is never read
            # (the text towers pool at the end token, or take the mask)
            if self.tokenizer.eos_token is None:
                raise DataError(f"model.name={name!r}: its tokenizer has neither a padding "
                                "token nor an end token to pad captions with; set pad_token "
                                "in its tokenizer_config.json")
            log.info("the tokenizer of %s has no padding token; captions are padded with its "
                     "end token %r (masked)", name, self.tokenizer.eos_token)
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        made = self.tokenizer(list(texts), padding="max_length", truncation=True,
                              max_length=self.max_length, return_tensors="pt")
        ids = made["input_ids"]
        return ids, made.get("attention_mask", torch.ones_like(ids))

    def __repr__(self) -> str:
        return f"{type(self.tokenizer).__name__}({self.name!r}, max_length={self.max_length})"


class ProcessorTransform:
    """A checkpoint's own processor, loaded by transformers' ``auto`` class from the model's
    folder or Hub id, as a dataset transform; a subclass says how it is called. Picklable, for
    loader workers; its repr (recorded in the file's ``transform`` attr) holds its settings."""

    auto: str  # the transformers class that loads it: "AutoImageProcessor"
    what: str  # what it processes, in messages and its config's type key: "image"
    fix: str  # what to do where the checkpoint has none

    def __init__(self, name: str):
        import transformers

        self.name = name
        try:
            self.processor = getattr(transformers, self.auto).from_pretrained(source_of(name))
        except (OSError, ValueError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise DataError(f"model.name={name!r} has no {self.what} processor that {self.auto} "
                            f"can load ({first}); {self.fix}") from None

    def __repr__(self) -> str:
        settings = {k: v for k, v in self.processor.to_dict().items()
                    if k not in (f"{self.what}_processor_type", "processor_class")}
        return (f"{type(self.processor).__name__}.from_pretrained({self.name!r}) "
                f"{json.dumps(settings, sort_keys=True, default=str)}")
