"""Streamed corpora: documents read, selected and tokenized on the fly, ahead of the model.

With ``dataset.streaming=true`` nothing is read or tokenized up front: the run takes the
documents of its shard (``i % count == index`` among the first ``limit``) as they come, skips
those a resumed run already stored, and a background thread tokenizes a few thousand documents
ahead of the model, no more. A run over a stream cannot know its length before it ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np

from probe.data.selection import OpenSelection

__all__ = ["stream_items", "pack"]

_CHUNK = 1000  # documents tokenized together
_AHEAD = 4  # chunks tokenized ahead of the model


def stream_items(dataset, selection: OpenSelection) -> Iterator[tuple[int, dict]]:
    """(sample index, item) of the selected samples, tokenized by a background thread that
    stays at most a few thousand documents ahead."""
    chunks: queue.Queue = queue.Queue(maxsize=_AHEAD)
    stop = threading.Event()

    def put(item) -> bool:
        # False once the consumer has gone: the thread then ends instead of waiting forever
        while not stop.is_set():
            try:
                chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in _chunks(dataset, selection):
                if not put(chunk):
                    return
            put(None)
        except BaseException as err:  # handed to the consumer, which raises it
            put(err)

    worker = threading.Thread(target=produce, name="probe-tokenizer", daemon=True)
    worker.start()
    try:
        while (chunk := chunks.get()) is not None:
            if isinstance(chunk, BaseException):
                raise chunk
            yield from chunk
    finally:
        stop.set()


def _chunks(dataset, selection: OpenSelection) -> Iterator[list[tuple[int, dict]]]:
    # the selected samples, a chunk of documents at a time
    samples = pack(dataset) if dataset.packing else _documents(dataset)
    taken, chunk = 0, []
    for sample, make in samples:
        takes = selection.takes(sample)
        if takes is None:
            break
        if not takes:
            continue
        taken += 1
        if taken > selection.start:  # a resumed run's stored documents are not tokenized again
            chunk.append((sample, make))
        if len(chunk) == _CHUNK:
            yield _made(dataset, chunk)
            chunk = []
    if chunk:
        yield _made(dataset, chunk)


def _documents(dataset) -> Iterator[tuple[int, object]]:
    # (document index, its row): tokenized later, and only if selected
    return enumerate(dataset.rows)


def _made(dataset, chunk: list[tuple[int, object]]) -> list[tuple[int, dict]]:
    if dataset.packing:  # windows come tokenized
        return chunk
    rows = [row for _, row in chunk]
    ids = dataset.tokenize([row[dataset.column] for row in rows],
                           [index for index, _ in chunk])
    return [(index, dataset.item(row_ids, _label(dataset, row), None))
            for (index, row), row_ids in zip(chunk, ids, strict=True)]


def _label(dataset, row) -> int:
    return -1 if dataset.label_column is None else int(row[dataset.label_column])


def pack(dataset) -> Iterator[tuple[int, dict]]:
    """(window index, item) of packing: every document and the separator, in one stream cut
    into windows of max_length tokens (the last may be shorter)."""
    separator, size = dataset.separator(), dataset.max_length
    tokens, documents = np.zeros(0, np.int32), np.zeros(0, np.int64)
    window = 0
    for texts, indices in _text_chunks(dataset):
        ids = dataset.tokenizer(texts, add_special_tokens=False)["input_ids"]
        tokens = np.concatenate([tokens, *(np.asarray([*row, separator], np.int32)
                                           for row in ids)])
        documents = np.concatenate([documents, *(np.full(len(row) + 1, index, np.int64)
                                                 for index, row in zip(indices, ids,
                                                                       strict=True))])
        full = len(tokens) - len(tokens) % size
        for start in range(0, full, size):
            yield window, dataset.item(tokens[start:start + size], -1,
                                       documents[start:start + size])
            window += 1
        tokens, documents = tokens[full:], documents[full:]
    if len(tokens):
        yield window, dataset.item(tokens, -1, documents)


def _text_chunks(dataset) -> Iterator[tuple[list[str], list[int]]]:
    texts, indices = [], []
    for index, row in enumerate(dataset.rows):
        texts.append(row[dataset.column])
        indices.append(index)
        if len(texts) == _CHUNK:
            yield texts, indices
            texts, indices = [], []
    if texts:
        yield texts, indices
