"""Text as token sequences, the data kind of language models (model=transformers).

    probe.data.text.corpus   dataset=text: files or a Hub dataset, tokenized by the model's own
    probe.data.tokens        dataset=tokens: pre-tokenized ids (jsonl or parquet lists, or .npy)
    probe.data.text.words    dataset=text on word-timed stories (.csv/.tsv with onsets), in
                             windows of context_tokens (WordStories)
    probe.data.text.feed      right-padded batches, rows per token (TextFeed)
    probe.data.text.stream    corpora read as they come, tokenized ahead of the model

Needs the `text` extra (transformers, datasets); image runs never import this package.
"""

# word-timed stories take their paths from dataset=text's TextDataset (corpus.add_sibling):
# here, so that they are registered before any corpus is read, whichever module is imported
from probe.data.text import words as _words  # noqa: F401
