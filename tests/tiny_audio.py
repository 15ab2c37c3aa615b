"""Tiny speech models and sounds, made on the fly: no downloads. Sounds are written with the
stdlib ``wave`` module; models and their feature extractors are saved with save_pretrained in
one folder. Import lazily (transformers takes seconds to import)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def tone(seconds: float, rate: int = 16000, seed: int = 0, channels: int = 1) -> np.ndarray:
    """(samples, channels) float in [-1, 1): a few sines and some noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * rate)) / rate
    sound = sum(rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * rng.uniform(100, 2000) * t)
                for _ in range(3)) + 0.05 * rng.standard_normal(len(t))
    return np.stack([np.roll(sound, 7 * c) for c in range(channels)], axis=1)


def write_wav(path: Path, sound: np.ndarray, rate: int = 16000) -> Path:
    """16-bit PCM, as most recordings are."""
    sound = sound[:, None] if sound.ndim == 1 else sound
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(sound.shape[1])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(sound, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """(samples,) float32 mono as soundfile decodes 16-bit PCM, and the rate."""
    with wave.open(str(path), "rb") as stream:
        raw = np.frombuffer(stream.readframes(stream.getnframes()), dtype="<i2")
        sound = raw.reshape(-1, stream.getnchannels()).astype(np.float32) / 32768
        return sound.mean(1).astype(np.float32), stream.getframerate()


def clip_folder(root: Path, seconds: list[float], classes: int = 2, rate: int = 16000) -> Path:
    """root/<class>/<n>.wav, clip n of ``seconds[n]`` s in class n % classes."""
    for n, length in enumerate(seconds):
        write_wav(root / f"c{n % classes}" / f"{n:02d}.wav", tone(length, rate, seed=n), rate)
    return root


def tiny_wav2vec2(directory: Path, *, masked: bool = True, head: str = "base", seed: int = 0,
                  labels: int = 2, vocab: int = 12, normalize: bool = True) -> Path:
    """A 2-layer wav2vec2, 32 wide, with a 3-conv stem (stride 5 x 4 x 2: 40 samples a frame,
    400 frames a second at 16 kHz); ``masked``: layer-norm stem and an extractor that gives an
    attention mask (wav2vec2-large style), else group-norm and none (wav2vec2-base style);
    ``normalize``: the extractor scales each clip to zero mean and unit variance."""
    import torch
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2ForSequenceClassification,
        Wav2Vec2Model,
    )

    config = Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16, 16), conv_stride=(5, 4, 2), conv_kernel=(10, 8, 4),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        feat_extract_norm="layer" if masked else "group", do_stable_layer_norm=masked,
        num_labels=labels, vocab_size=vocab, pad_token_id=0, ctc_loss_reduction="sum",
        mask_time_prob=0.0, classifier_proj_size=16)
    torch.manual_seed(seed)
    model = {"base": Wav2Vec2Model, "audio_classification": Wav2Vec2ForSequenceClassification,
             "ctc": Wav2Vec2ForCTC}[head](config)
    model.save_pretrained(directory)
    Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                             do_normalize=normalize, return_attention_mask=masked
                             ).save_pretrained(directory)
    return directory


def tiny_whisper(directory: Path, *, seconds: int = 2, seed: int = 0) -> Path:
    """A 2-layer Whisper, 32 wide, 16 mel bins, whose window is ``seconds`` long (its
    extractor pads every clip to it, as the real one pads to 30 s)."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel

    config = WhisperConfig(
        vocab_size=64, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=50 * seconds, max_target_positions=16,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    torch.manual_seed(seed)
    WhisperModel(config).save_pretrained(directory)
    WhisperFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160,
                            chunk_length=seconds, n_fft=400).save_pretrained(directory)
    return directory


def ctc_tokenizer(directory: Path) -> Path:
    """A character tokenizer for CTC (pad = blank = 0, "|" between words), saved beside the
    model as wav2vec2's is."""
    import json

    from transformers import Wav2Vec2CTCTokenizer

    letters = "abcdefghi"
    vocab = {"<pad>": 0, "|": 1, **{c: n + 2 for n, c in enumerate(letters)}, "<unk>": 11}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    Wav2Vec2CTCTokenizer(str(directory / "vocab.json"), pad_token="<pad>", unk_token="<unk>",
                         word_delimiter_token="|").save_pretrained(directory)
    return directory


def tiny_encoder(directory: Path, kind: str, seed: int = 0) -> Path:
    """A 2-layer HuBERT or WavLM, 32 wide, with tiny_wav2vec2's stem and a masking extractor."""
    import torch
    from transformers import (
        HubertConfig,
        HubertModel,
        Wav2Vec2FeatureExtractor,
        WavLMConfig,
        WavLMModel,
    )

    config_class, model_class = {"hubert": (HubertConfig, HubertModel),
                                 "wavlm": (WavLMConfig, WavLMModel)}[kind]
    config = config_class(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16, 16), conv_stride=(5, 4, 2), conv_kernel=(10, 8, 4),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="layer",
        do_stable_layer_norm=True, mask_time_prob=0.0)
    torch.manual_seed(seed)
    model_class(config).save_pretrained(directory)
    Wav2Vec2FeatureExtractor(return_attention_mask=True).save_pretrained(directory)
    return directory
