"""Speech and audio checkpoints of transformers (wav2vec2, HuBERT, WavLM, Whisper, ...): the
family that ``model=transformers`` specialises to for a model whose main input is sound
(``input_values``, ``input_features``).

It reads ``dataset=audio`` (probe.data.audio), whose batches the checkpoint's own feature
extractor makes; its length function tells that feed how many real frames a clip gives (the
model's own ``_get_feat_extract_output_lengths``: wav2vec2's strided convolutions, Whisper's
two), so that
outputs of shape (clips, frames, ...) give one row per real frame, padding never stored. An
encoder-decoder (Whisper) runs its encoder, and its decoder on each clip's transcript
(``dataset.transcript_column``, tokenized by the checkpoint's tokenizer as a target),
teacher-forced, with a row per transcript token (probe.families.hf_seq2seq); without a
transcript, on its start token only (not at all when every hooked layer is in the encoder),
its layers refused; generating (``generate.max_new_tokens``), on the steps of its own
``generate()``. Objectives: ``top1`` and ``target`` of an audio classification head;
``nll`` of a CTC head, the CTC loss of each clip's transcript, and of an encoder-decoder, the
transcript's loss through its decoder.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import GenerateConfig, Reduce
from probe.data.feed import IGNORED_TARGET, Batch, DataKind, Feed
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.families.base import Answers, Family
from probe.families.hf_attention import eager_patterns
from probe.families.hf_generation import nll
from probe.families.hf_names import hf_names
from probe.families.hf_seq2seq import (
    decoded_layout,
    generate_decoded,
    is_encoder_decoder,
    with_decoder_start,
)
from probe.families.hf_verify import verify_run
from probe.families.hub import head_of, require_head, required_logits, target
from probe.file.format import TRANSCRIPT

__all__ = ["AudioFamily", "AUDIO", "ctc_nll"]

# heads of class logits (wav2vec2's audio classifier is named ...ForSequenceClassification)
_CLASSIFIERS = ("audio_classification", "sequence_classification")


class AudioFamily(Family):
    """Audio encoders: fed by their feature extractor, outputs (clips, frames, ...) follow the
    feed's layout of frames, whose real ones the model's length function gives."""

    name = "transformers-audio"
    patterns = staticmethod(eager_patterns)  # hooks=[attention] (probe.families.hf_attention)
    names = staticmethod(hf_names)  # blocks.6, lm_head, ... (probe.families.hf_names)
    verify = staticmethod(verify_run)  # the checks of those (probe.families.hf_verify)
    libraries = ("transformers",)
    reads = (DataKind.audio,)

    def place(self, model: nn.Module, device: torch.device, asked: str
              ) -> tuple[nn.Module, torch.device]:
        if getattr(model, "hf_device_map", None):
            raise ConfigError("model.device_map is for language models larger than one device; "
                              "leave it unset for an audio model")
        return model.to(device), device

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        return (f"{type(model).__name__} is an audio model: it reads sound, not these inputs; "
                "add dataset=audio dataset.root=<a folder of class subfolders of sound files> "
                "(or dataset.path=<a .csv or .jsonl list of files>)")

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        Family.check(self, model, feed, reduces)
        if not hasattr(model, "_get_feat_extract_output_lengths"):
            raise ConfigError(
                f"{type(model).__name__} does not say how many frames a clip gives (no "
                "_get_feat_extract_output_lengths), so its real frames are not known; use an "
                "encoder of frames (wav2vec2, HuBERT, WavLM, Whisper; AST's patches are not "
                "supported yet)")

    def output_lengths(self, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        return _Lengths(model)

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        # an encoder-decoder's: its decoder's rows are its transcript's (hf_seq2seq)
        return decoded_layout(model, with_transcript(model, batch), batch.layout)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        # the extractor gives float32; a model in bfloat16 or float16 reads its own type
        inputs = {key: value.to(model.dtype) if value.is_floating_point() else value
                  for key, value in with_transcript(model, batch).inputs.items()}
        if input_grad:  # sound is a float input: the graph starts at it
            name = model.main_input_name
            inputs[name] = inputs[name].detach().requires_grad_()
        # an encoder-decoder (Whisper) runs whole (its hooks see a pass start), its decoder on
        # the transcript or its start token; a run that hooks the encoder alone stops before
        # the decoder
        return model(**with_decoder_start(model, inputs))

    def detokenizer(self, model_cfg: DictConfig) -> Callable[[list[list[int]]], list[str]]:
        # loaded when an answer is decoded: generate() refuses a model that writes none first
        name = str(model_cfg.name)
        return lambda ids: _tokenizer_of(name).batch_decode(ids, skip_special_tokens=True)

    def generate(self, model: nn.Module, inputs: dict, settings: GenerateConfig,
                 all_logits: bool = False) -> Answers:
        if not is_encoder_decoder(model):  # a CTC head or an encoder writes no answer
            return Family.generate(self, model, inputs, settings, all_logits)
        # Whisper's own generate(): its answer is its decoder's (probe.families.hf_seq2seq)
        return generate_decoded(model, inputs, settings)

    def decodes_answers(self, model: nn.Module) -> bool:
        return is_encoder_decoder(model)

    def logits(self, output) -> torch.Tensor | None:
        return getattr(output, "logits", None)

    def objective(self, name: str, model: nn.Module) -> Callable:
        named = {"top1": (_top1, _CLASSIFIERS),
                 "target": (target, _CLASSIFIERS),
                 "nll": (None, ("ctc", "seq2seq_lm"))}
        if name not in named:
            raise ConfigError(f"objective={name!r} is unknown for an audio model; use top1 or "
                              "target (model.head=audio_classification), nll (model.head=ctc, "
                              "with dataset.transcript_column), or a config with a _target_ "
                              "callable")
        function, heads = named[name]
        require_head(model, name, heads)
        if name == "nll":  # a transcript's: by CTC, or through a decoder, teacher-forced
            function = _ctc_nll(model) if head_of(model) == "ctc" else _decoded_nll(model)
        return lambda output, batch: function(
            required_logits(output, "audio_classification or ctc"), batch)


# served through probe.families.transformers, which builds it (not registered: its family is
# the library's)
AUDIO = AudioFamily()


class _Lengths:
    """The model's own length function (real input lengths -> real frames), on the model's
    config only: what a loader worker needs of the model, and picklable."""

    def __init__(self, model: nn.Module):
        self.model_class, self.config = type(model), model.config

    def __call__(self, real: torch.Tensor) -> torch.Tensor:
        return self.model_class._get_feat_extract_output_lengths(self, real)


def with_transcript(model: nn.Module, batch: Batch) -> Batch:
    """``batch`` with each clip's transcript as an encoder-decoder's target (``labels``,
    padded as transformers pads them), where the model is one and the batch has transcripts,
    a clip a row (a clip fed in windows has one transcript for several rows: none)."""
    texts = batch.sample_rows.get(TRANSCRIPT)
    if (not is_encoder_decoder(model) or texts is None or "labels" in batch.inputs
            or len(texts) != len(next(iter(batch.inputs.values())))):
        return batch
    tokenizer = _tokenizer(model, "an encoder-decoder reads each clip's transcript")
    start = model.config.decoder_start_token_id
    rows = []
    for ids in tokenizer(text_target=[str(text) for text in texts]).input_ids:
        # a tokenizer that puts the start token first (Whisper's): the shift puts it there
        # again, so it goes, as transformers' own recipe for Whisper's targets does
        rows.append(torch.tensor(ids[1:] if ids and ids[0] == start else ids))
    labels = nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=IGNORED_TARGET)
    device = next(iter(batch.inputs.values())).device
    return replace(batch, inputs={**batch.inputs, "labels": labels.to(device)})


def _decoded_nll(model: nn.Module) -> Callable:
    def transcripts_nll(logits: torch.Tensor, batch) -> torch.Tensor:
        if TRANSCRIPT not in batch.sample_rows:
            raise ConfigError("objective=nll of an encoder-decoder scores each clip's "
                              "transcript through its decoder; set dataset.transcript_column="
                              "<a column of dataset.path>")
        return nll(logits, with_transcript(model, batch))
    return transcripts_nll


def _top1(logits: torch.Tensor, batch) -> torch.Tensor:
    return logits.amax(1)


@functools.cache
def _tokenizer_of(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def _tokenizer(model: nn.Module, why: str):
    """The checkpoint's tokenizer, which reads its transcripts.

    Raises:
        ConfigError: the checkpoint has none that loads.
    """
    try:
        return _tokenizer_of(str(model.name_or_path))
    except (OSError, ValueError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{why} with the checkpoint's tokenizer, and "
                          f"{model.name_or_path!r} has none that loads ({first}); save the "
                          "tokenizer beside the model") from None


def _ctc_nll(model: nn.Module) -> Callable:
    tokenizer = _tokenizer(model, "objective=nll scores transcripts")
    blank = int(model.config.pad_token_id or 0)
    return lambda logits, batch: ctc_nll(logits, batch, tokenizer, blank)


def ctc_nll(logits: torch.Tensor, batch, tokenizer, blank: int) -> torch.Tensor:
    """Each clip's CTC loss of its transcript (``/transcript``, tokenized by ``tokenizer``),
    over its real frames, with ``blank`` the blank token (the model's pad token, as
    transformers' CTC heads have it); summed over the transcript's tokens."""
    texts = batch.sample_rows.get(TRANSCRIPT)
    if texts is None:
        raise ConfigError("objective=nll of a CTC head scores each clip's transcript; set "
                          "dataset.transcript_column=<a column of dataset.path>")
    ids = [torch.tensor(row, dtype=torch.long) for row in tokenizer(list(texts)).input_ids]
    labels = nn.utils.rnn.pad_sequence(ids, batch_first=True).to(logits.device)
    log_probs = nn.functional.log_softmax(logits.float(), dim=-1).transpose(0, 1)
    return nn.functional.ctc_loss(log_probs, labels, batch.layout.lengths.to(logits.device),
                                  torch.tensor([len(i) for i in ids], device=logits.device),
                                  blank=blank, reduction="none", zero_infinity=True)
