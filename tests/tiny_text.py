"""A tiny language model and corpus, made on the fly: no downloads. Import lazily (transformers
takes seconds to import)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the", "cat", "dog", "bird", "sat", "ran", "flew", "on", "under", "over", "a", "mat",
         "park", "tree", "house", "big", "small", "red", "blue", "quick", "slow", "and", "then",
         "it", "was", "very")


def documents(count: int, seed: int = 0, low: int = 3, high: int = 40) -> list[str]:
    """Sentences of ``low`` to ``high`` words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
            for _ in range(count)]


def write_jsonl(path: Path, texts: list[str], labels: list[int] | None = None) -> Path:
    with path.open("w") as stream:
        for n, text in enumerate(texts):
            row = {"text": text} if labels is None else {"text": text, "label": labels[n]}
            stream.write(json.dumps(row) + "\n")
    return path


def tiny_gpt2(directory: Path, *, layers: int = 2, width: int = 32, heads: int = 2,
              seed: int = 0, positions: int = 128, vocab: int | None = None) -> Path:
    """A GPT-2 of ``layers`` blocks, ``width`` wide, with a byte-level BPE tokenizer trained
    here on the corpus words; both saved with save_pretrained in ``directory``. ``vocab``
    sizes the model's embedding and head (default: the tokenizer's, a few hundred)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(documents(200, seed=99), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                        bos_token="<|endoftext|>")
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=vocab or len(tokenizer), n_positions=positions, n_embd=width,
                        n_layer=layers, n_head=heads, bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
