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

__all__ = ["transformers_model", "head_of", "HEADS", "nll", "FAMILY"]

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


def transformers_model(name: str, weights: str | None = "pretrained", head: str = "causal_lm",
                       dtype: str = "float32", trust_remote_code: bool = False,
                       device_map: str | dict | None = None,
                       offload_folder: str | None = None) -> nn.Module:
    """A transformers model in eval mode, its key/value cache off.

    Args:
        name: a Hub id (``gpt2``, ``meta-llama/Llama-3.2-1B``) or a folder saved with
            ``save_pretrained``.
        weights: ``pretrained`` (from_pretrained) or None (random init from the config).
        head: causal_lm, masked_lm, sequence_classification, image_classification, ctc,
            audio_classification, or base (no head).
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
    for key, value, allowed in (("head", head, HEADS), ("dtype", dtype, _DTYPES),
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
        auto = getattr(transformers, HEADS[head])
        if weights == "pretrained":
            model = auto.from_pretrained(source, config=config, dtype=_DTYPES[dtype],
                                         device_map=_plain(device_map),
                                         offload_folder=offload_folder, **options)
        else:
            model = auto.from_config(config, **options).to(_DTYPES[dtype])
    except OSError as err:
        raise _unavailable(str(name), source, err) from None
    except ValueError as err:  # a config that this Auto class cannot build
        first = str(err).strip().splitlines()[0]
        raise ConfigError(f"model.name={name!r} with model.head={head}: {first}") from None
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return model.eval()


def _plain(device_map):
    # a map given in the config arrives as a DictConfig; transformers wants a dict
    return dict(device_map) if hasattr(device_map, "items") else device_map


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
        module = _BY_INPUT.get(getattr(model, "main_input_name", "input_ids"))
        if module is None:
            return self
        try:
            return importlib.import_module(module).FAMILY
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            return self

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
        if not feed.positions or getattr(feed, "kind", "text") != "text":
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
        head = head_of(model)
        if head not in heads:
            raise ConfigError(
                f"objective={name} needs model.head={' or '.join(heads)}, but the model has "
                f"{'no head' if head == 'base' else f'head {head}'} ({type(model).__name__})"
            )
        return lambda output, batch: function(self._required_logits(output), batch)

    def example_batch(self, model: nn.Module):
        from probe.feeds import Batch

        # a few tokens of the model's own vocabulary: listing layers needs no corpus
        ids = (torch.arange(8) % model.get_input_embeddings().num_embeddings).view(1, -1)
        return Batch(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1),
                     {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                     keep=torch.ones(ids.shape, dtype=torch.bool))

    def _required_logits(self, output) -> torch.Tensor:
        logits = self.logits(output)
        if logits is None:
            raise ConfigError("the model returns no logits (model.head=base?); use model.head="
                              "causal_lm, masked_lm or sequence_classification for gradients")
        return logits


FAMILY = register(TransformersFamily())


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
