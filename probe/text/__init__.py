"""Text as token sequences, the data kind of language models (model=transformers).

    probe.text.data      dataset=text: files or a Hub dataset, tokenized by the model's tokenizer
    probe.text.ids       dataset=tokens: pre-tokenized ids (jsonl or parquet lists, or .npy)
    probe.text.feed      right-padded batches, rows per token (TextFeed)
    probe.text.stream    corpora read as they come, tokenized ahead of the model

Needs the `text` extra (transformers, datasets); image runs never import this package.
"""
