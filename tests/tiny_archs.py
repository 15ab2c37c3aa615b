"""Tiny random Hugging Face checkpoints of many architectures, made on the fly: no downloads.
Each is 3 layers (3 + 3 for encoder-decoders) 32 wide, 4 heads (2 key/value heads where the
config has them), with a word-level tokenizer saved beside it. Import lazily (transformers takes
seconds to import).

How they differ (transformers 5.25): output_hidden_states gives layers + 1 states, state i + 1
the output of block i, except that the last is after the final norm where there is one (every
decoder, T5, Whisper, ModernBERT; not BERT-like post-norm encoders, Bart or Marian). Mamba and
FalconMamba have no embedding state: state i is block i's output, the last the final norm's.
Attention weights come back only from "eager" attention (the default for gpt_neo, gemma2, bloom,
mpt, xglm and deberta-v2); under "sdpa" output_attentions gives an empty tuple (Falcon: Nones)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.tiny_text import WORDS

# Under their standard names; each config gets those it has as a field, else through its
# attribute_map (the first alias of a field wins: Whisper maps both head counts to its encoder's)
SIZES = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
         "max_position_embeddings": 128, "num_local_experts": 4, "num_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32}
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
ENCODER_SPECIALS = ("[CLS]", "[SEP]", "[MASK]")
WHISPER_SECONDS = 1  # the window Whisper's extractor pads every clip to (the real one: 30 s)
# Sliding-window attention over 4 tokens: short sentences already see it
WINDOW = 4
ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention"]
# AutoTokenizer loads these with their own tokenizer class, whatever tokenizer_config.json says,
# and that class rebuilds a byte-level BPE from the saved vocabulary (and merges)
BYTE_LEVEL = {"qwen2"}
ENCODER_DECODER = {"encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
                   "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}


@dataclass(frozen=True)
class Arch:
    """How to make one architecture: its config and model classes (names in transformers) and
    the config kwargs it needs beyond SIZES."""
    name: str
    kind: str  # "decoder" | "encoder" | "encoder-decoder"
    config_class: str
    model_class: str
    options: dict = field(default_factory=dict)


def _decoder(name: str, prefix: str, head: str = "ForCausalLM", **options) -> Arch:
    return Arch(name, "decoder", f"{prefix}Config", prefix + head, options)


def _encoder(name: str, prefix: str, **options) -> Arch:
    return Arch(name, "encoder", f"{prefix}Config", f"{prefix}ForMaskedLM", options)


def _seq2seq(name: str, prefix: str, head: str = "ForConditionalGeneration", **options) -> Arch:
    return Arch(name, "encoder-decoder", f"{prefix}Config", prefix + head, options)


ARCHITECTURES: dict[str, Arch] = {arch.name: arch for arch in [
    # decoders
    _decoder("gpt2", "GPT2", "LMHeadModel", n_inner=64),
    _decoder("gpt_neox", "GPTNeoX"),
    _decoder("gptj", "GPTJ", n_inner=64, rotary_dim=4),
    # layers: global, local, global
    _decoder("gpt_neo", "GPTNeo", attention_types=[[["global", "local"], 1], [["global"], 1]],
             window_size=WINDOW),
    _decoder("llama", "Llama"),
    _decoder("mistral", "Mistral", sliding_window=WINDOW),
    _decoder("mixtral", "Mixtral"),
    _decoder("qwen2", "Qwen2"),
    _decoder("qwen2_moe", "Qwen2Moe", shared_expert_intermediate_size=32),
    _decoder("qwen3", "Qwen3"),
    _decoder("qwen3_moe", "Qwen3Moe"),
    _decoder("gemma", "Gemma"),
    _decoder("gemma2", "Gemma2", sliding_window=WINDOW, layer_types=ALTERNATING),
    Arch("gemma3", "decoder", "Gemma3TextConfig", "Gemma3ForCausalLM",
         {"sliding_window": WINDOW, "layer_types": ALTERNATING}),
    _decoder("phi", "Phi"),
    _decoder("phi3", "Phi3", original_max_position_embeddings=128),
    # as falcon-7b: one key/value head, attention and MLP in parallel
    _decoder("falcon", "Falcon", ffn_hidden_size=64),
    _decoder("bloom", "Bloom"),
    _decoder("mpt", "Mpt", expansion_ratio=2, max_seq_len=128),
    _decoder("opt", "OPT", ffn_dim=64, word_embed_proj_dim=32),
    _decoder("olmo", "Olmo"),
    _decoder("olmo2", "Olmo2"),
    _decoder("olmoe", "Olmoe"),
    _decoder("stablelm", "StableLm"),
    _decoder("starcoder2", "Starcoder2"),
    _decoder("cohere", "Cohere"),
    _decoder("cohere2", "Cohere2", sliding_window=WINDOW, layer_types=ALTERNATING),
    _decoder("granite", "Granite"),
    _decoder("granitemoe", "GraniteMoe"),
    _decoder("codegen", "CodeGen", n_inner=64, n_ctx=128, rotary_dim=4),
    _decoder("gpt_bigcode", "GPTBigCode", n_inner=64),
    _decoder("helium", "Helium"),
    _decoder("smollm3", "SmolLM3", no_rope_layer_interval=2),  # layer 1 without rotary
    _decoder("glm", "Glm"),
    _decoder("persimmon", "Persimmon"),
    _decoder("biogpt", "BioGpt"),
    _decoder("xglm", "XGLM", ffn_dim=64),
    _decoder("nemotron", "Nemotron"),
    # multi-head latent attention (as many key/value heads as query heads); layer 0 dense, then
    # mixtures of experts
    _decoder("deepseek_v3", "DeepseekV3", num_key_value_heads=4, q_lora_rank=16,
             kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
             n_routed_experts=4, n_shared_experts=1, n_group=1, topk_group=1,
             first_k_dense_replace=1),
    # layers: mamba, attention + experts, mamba
    _decoder("jamba", "Jamba", attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
             expert_layer_offset=1, mamba_d_state=8),
    # no CUDA kernels needed: without mamba-ssm they run a PyTorch scan
    _decoder("mamba", "Mamba", state_size=8),
    _decoder("falcon_mamba", "FalconMamba", state_size=8),
    # encoders
    _encoder("bert", "Bert"),
    # positions start after the padding index: 128 tokens need 130
    _encoder("roberta", "Roberta", max_position_embeddings=130),
    _encoder("xlm-roberta", "XLMRoberta", max_position_embeddings=130),
    _encoder("distilbert", "DistilBert", hidden_dim=64),
    _encoder("electra", "Electra", embedding_size=32),
    _encoder("albert", "Albert", embedding_size=16),
    # as deberta-v3: relative positions, disentangled attention
    _encoder("deberta-v2", "DebertaV2", relative_attention=True, pos_att_type=["p2c", "c2p"],
             position_buckets=16, max_relative_positions=-1, norm_rel_ebd="layer_norm",
             share_att_key=True, position_biased_input=False),
    # layers: global, local, local
    _encoder("modernbert", "ModernBert", local_attention=WINDOW),
    # encoder-decoders
    _seq2seq("t5", "T5", d_ff=64, num_decoder_layers=3, relative_attention_num_buckets=8,
             relative_attention_max_distance=16),
    _seq2seq("mt5", "MT5", d_ff=64, num_decoder_layers=3, relative_attention_num_buckets=8,
             relative_attention_max_distance=16),
    _seq2seq("bart", "Bart", **ENCODER_DECODER),
    _seq2seq("marian", "Marian", "MTModel", **ENCODER_DECODER),
    # its encoder and decoder are Gemma 2 stacks, each with a config of its own (tiny_config
    # sizes each)
    _seq2seq("t5gemma", "T5Gemma", encoder={"sliding_window": WINDOW,
                                            "layer_types": ALTERNATING},
             decoder={"sliding_window": WINDOW, "layer_types": ALTERNATING}),
    _seq2seq("whisper", "Whisper", **ENCODER_DECODER, num_mel_bins=16,
             max_source_positions=50 * WHISPER_SECONDS, max_target_positions=128),
]}


def word_tokenizer(kind: str = "decoder", words: Sequence[str] = WORDS, byte_level: bool = False):
    """A word-level tokenizer of ``words`` (whitespace split) and <pad> <unk> <s> </s>, ids 0-3;
    for encoders also [CLS] [SEP] [MASK], which it puts around each text ([CLS] a [SEP] b
    [SEP] for pairs); for encoder-decoders it ends each text with </s>. ``byte_level``: a
    byte-level BPE instead, trained here until each word, with and without its leading space,
    is one token (for the architectures whose AutoTokenizer class rebuilds the tokenizer as
    such, see BYTE_LEVEL)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = SPECIALS + (ENCODER_SPECIALS if kind == "encoder" else ())
    if byte_level:
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=list(specials),
                                      show_progress=False)
        backend.train_from_iterator([*words, *(" " + word for word in words)], trainer)
    else:
        vocab = {token: n for n, token in enumerate([*specials, *dict.fromkeys(words)])}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    named = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    if kind == "encoder":
        named |= {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[(token, backend.token_to_id(token)) for token in ("[CLS]", "[SEP]")])
    elif kind == "encoder-decoder":
        backend.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B:1 </s>:1",
            special_tokens=[("</s>", backend.token_to_id("</s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=SIZES[
        "max_position_embeddings"], **named)


def arch_tokenizer(name: str):
    """The tokenizer tiny_checkpoint saves with architecture ``name``."""
    return word_tokenizer(ARCHITECTURES[name].kind, byte_level=name in BYTE_LEVEL)


def tiny_config(name: str, tokenizer=None):
    """The config of architecture ``name``: SIZES under the names it knows, its options, and
    the special ids and size of ``tokenizer`` (default: arch_tokenizer's)."""
    import transformers

    arch = ARCHITECTURES[name]
    config_class = getattr(transformers, arch.config_class)
    tokenizer = arch_tokenizer(name) if tokenizer is None else tokenizer
    kwargs = _sized(config_class)
    ids = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
           "eos_token_id": tokenizer.eos_token_id, "cls_token_id": tokenizer.cls_token_id,
           "sep_token_id": tokenizer.sep_token_id,
           # as each family's own: Whisper starts from <|startoftranscript|>, Bart from </s>
           "decoder_start_token_id": {"whisper": tokenizer.bos_token_id,
                                      "bart": tokenizer.eos_token_id
                                      }.get(name, tokenizer.pad_token_id)}
    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs |= {key: value for key, value in ids.items() if key in fields and value is not None}
    options = dict(arch.options)
    for part, part_class in getattr(config_class, "sub_configs", {}).items():
        if part in options:  # a stack with a config of its own (T5Gemma's), sized alike
            own = {f.name for f in dataclasses.fields(part_class)}
            options[part] = {**_sized(part_class), "vocab_size": len(tokenizer),
                             **{key: value for key, value in ids.items()
                                if key in own and value is not None}, **options[part]}
    return config_class(**{**kwargs, "vocab_size": len(tokenizer), **options})


def _sized(config_class) -> dict:
    # SIZES under the names the config knows: a field, else an alias of its attribute_map
    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs = {}
    for key, value in SIZES.items():
        key = key if key in fields else config_class.attribute_map.get(key, key)
        if key in fields:
            kwargs.setdefault(key, value)
    return kwargs


def tiny_checkpoint(name: str, folder: Path, seed: int = 0) -> Path:
    """Architecture ``name`` with random weights (torch.manual_seed(seed)), its config and its
    tokenizer (and for Whisper its feature extractor), saved with save_pretrained in
    ``folder``."""
    import torch
    import transformers

    tokenizer = arch_tokenizer(name)
    config = tiny_config(name, tokenizer)
    torch.manual_seed(seed)
    getattr(transformers, ARCHITECTURES[name].model_class)(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if name == "whisper":
        transformers.WhisperFeatureExtractor(
            feature_size=config.num_mel_bins, sampling_rate=16000, hop_length=160,
            chunk_length=WHISPER_SECONDS, n_fft=400).save_pretrained(folder)
    return Path(folder)
