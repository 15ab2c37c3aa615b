"""The data kinds, behind one interface (probe.data.feed.Feed), and their row layouts.

    probe.data.images    images: the synthetic default, an image folder, CIFAR-10
    probe.data.tensors   the tensors feed (any dataset of tensors); probe.data.pairs
    probe.data.text      text for language models; probe.data.tokens: pre-tokenized ids
    probe.data.audio     sound for speech and audio encoders
    probe.data.layouts   how a captured tensor's positions become stored rows
    probe.data.selection, .buckets, .transforms: which samples, batched how, preprocessed how
"""
