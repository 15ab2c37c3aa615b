"""Text as token sequences, the data kind of language models (model=transformers).

    probe.data.text.corpus   dataset=text: files or a Hub dataset, tokenized by the model's own
    probe.data.tokens        dataset=tokens: pre-tokenized ids (jsonl or parquet lists, or .npy)
    probe.data.text.feed      right-padded batches, rows per token (TextFeed)
    probe.data.text.stream    corpora read as they come, tokenized ahead of the model

Needs the `text` extra (transformers, datasets); image runs never import this package.
"""
