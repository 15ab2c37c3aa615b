"""Language models and text: token-level activations and gradients of Hugging Face models.

    probe.text.models    model=transformers: AutoModelFor<head> by Hub id or folder
    probe.text.data      dataset=text: files or a Hub dataset, tokenized by the model's tokenizer
    probe.text.feed      right-padded batches, rows per token, the nll/top1/target objectives

Needs the `text` extra (transformers, datasets); image runs never import this package.
"""
