"""Image-text pairs for two-tower models: ``dataset=pairs dataset.path=pairs.csv``.

A csv or jsonl file has one pair a row: an image file (``image_column``, relative to the file's
folder or absolute) and its caption (``text_column``). Each item is the image through the
model's own preprocessing (``transform=auto``) and the caption through the model's own
tokenizer (``tokenizer=auto``), padded to the text tower's length, so that a batch feeds both
towers at once (``objective=similarity``: each pair's matched logit). Rows are one per pair,
with its image file (``/file``) and caption (``/caption``).

    data = PairsDataset("pairs.csv", transform=image_processor, tokenizer=caption_tokenizer)
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.feed import Batch, DataKind, bad_sample
from probe.data.tensors import TensorFeed
from probe.errors import ConfigError, DataError
from probe.file.format import CAPTION, FILE, Attr, DatasetSpec

__all__ = ["PairsDataset", "PairsFeed"]

log = logging.getLogger(__name__)


class PairsFeed(TensorFeed):
    """Batches of image-text pairs: ``{"pixel_values", "input_ids", "attention_mask"}``; read
    in order, as the tensors feed reads its samples."""

    unit = "pair"
    positions = False
    kind = DataKind.pairs  # both towers of a two-tower model run (probe.families.towers)
    hint = "a model with an image tower and a text tower (CLIP, SigLIP, open_clip)?"
    targets_hint = "pairs have no targets; use objective=similarity"

    def has_targets(self, dataset: PairsDataset, sample: int) -> bool:
        return False

    def bookkeeping(self, dataset: PairsDataset) -> dict[str, DatasetSpec]:
        dims = {Attr.DIMS: ["sample"]}
        return {FILE: DatasetSpec((), "str", dims, compressible=False),
                CAPTION: DatasetSpec((), "str", dims, compressible=False)}

    def attrs(self, dataset: PairsDataset) -> dict:
        from probe.data.transforms import describe_transform

        return {"transform": json.dumps(describe_transform(dataset.transform)),
                "tokenizer": repr(dataset.tokenizer)}

    def describe(self, batch: Batch) -> str:
        inputs = batch.inputs
        return (f"an image of shape {tuple(inputs['pixel_values'].shape[1:])} and "
                f"{inputs['input_ids'].shape[1]} tokens")

    @staticmethod
    def _rows(dataset: PairsDataset, indices: list[int], skip_bad: bool = False):
        return _Rows(dataset, indices, skip_bad=skip_bad)


class PairsDataset(Dataset):
    """The pairs of a csv or jsonl file (see the module's docstring).

    Args:
        path: the csv or jsonl file.
        image_column: the column of image files, relative to the file's folder or absolute.
        text_column: the column of captions.
        transform: the image preprocessing (probe.pipeline.build passes the model's own for
            ``auto``);
            ``imagenet``: the ImageNet evaluation transform at ``image_size``.
        tokenizer: captions -> (ids, attention mask) at one length (probe.pipeline.build passes the
            model's own for ``auto``).
        image_size: the crop of the ImageNet transform.

    Raises:
        DataError: the file does not exist or cannot be read.
        ConfigError: a column that the file lacks, or no tokenizer.
    """

    feed = PairsFeed()

    def __init__(self, path: str, image_column: str = "image", text_column: str = "text",
                 transform: str | Callable = "auto", tokenizer: str | Callable = "auto",
                 image_size: int = 224):
        from probe.data.transforms import imagenet_transform, resolve_transform

        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise DataError(f"dataset.path={str(path)!r}: no such file; pass a csv or jsonl of "
                            "image paths and captions")
        if not callable(tokenizer):
            raise ConfigError(f"dataset.tokenizer={tokenizer!r}: dataset=pairs tokenizes the "
                              "captions with the model's own tokenizer (tokenizer=auto), which "
                              "this model does not have; use model=transformers (CLIP, SigLIP) "
                              "or model=open_clip")
        self.transform = resolve_transform(transform, lambda: imagenet_transform(image_size))
        self.tokenizer = tokenizer
        self.rows = _read_rows(self.path)
        for key, column in (("image_column", image_column), ("text_column", text_column)):
            if self.rows and column not in self.rows[0]:
                raise ConfigError(f"dataset.{key}={column!r} is not a column of {self.path}; "
                                  f"it has {', '.join(map(str, self.rows[0]))}")
        self.files = [str(row[image_column]) for row in self.rows]
        self.captions = [str(row[text_column]) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        from PIL import Image

        file = Path(self.files[index]).expanduser()
        file = file if file.is_absolute() else self.path.parent / file
        with Image.open(file) as image:
            pixels = self.transform(image.convert("RGB"))
        ids, mask = self.tokenizer([self.captions[index]])
        return {"pixel_values": pixels, "input_ids": ids[0], "attention_mask": mask[0]}

    def fingerprint(self) -> dict:
        """The pairs themselves (files and captions), for a resumed run's check."""
        lines = "\n".join(f"{f}\t{c}" for f, c in zip(self.files, self.captions, strict=True))
        return {"files": hashlib.sha256(lines.encode()).hexdigest()[:16]}


def _read_rows(path: Path) -> list[dict]:
    try:
        if path.suffix.lower() in (".jsonl", ".json"):
            with path.open() as stream:
                return [json.loads(line) for line in stream if line.strip()]
        with path.open(newline="") as stream:
            return list(csv.DictReader(stream))
    except (OSError, ValueError, csv.Error) as err:
        raise DataError(f"dataset.path={str(path)!r} cannot be read as "
                        f"{'jsonl' if path.suffix.lower() in ('.jsonl', '.json') else 'csv'} "
                        f"({type(err).__name__}: {str(err).splitlines()[0]})") from None


class _Rows(Dataset):
    """The dataset seen through ``indices``, as (dataset index, item or why it failed)."""

    def __init__(self, dataset: PairsDataset, indices: list[int], skip_bad: bool = False):
        self.dataset, self.indices, self.skip_bad = dataset, indices, skip_bad

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, dict | str]:
        index = self.indices[i]
        try:
            return index, self.dataset[index]
        except Exception as err:  # an image that cannot be read: said with its file
            said = bad_sample(index, err, self.dataset.files[index])
            if self.skip_bad:
                log.warning("left out (dataset.on_error=skip): %s", said.split(";")[0])
            return index, said

    def collate(self, rows: list[tuple[int, dict | str]]) -> Batch:
        bad = [(index, item) for index, item in rows if isinstance(item, str)]
        empty = torch.zeros(0, dtype=torch.int64)
        if bad and not self.skip_bad:  # raised by the loader, in the run's process
            return Batch(empty, empty, {}, failure=bad[0][1])
        rows = [row for row in rows if not isinstance(row[1], str)]
        index = torch.tensor([i for i, _ in rows], dtype=torch.int64)
        inputs = ({key: torch.stack([item[key] for _, item in rows])
                   for key in ("pixel_values", "input_ids", "attention_mask")} if rows else {})
        files, captions = self.dataset.files, self.dataset.captions
        sample_rows = {FILE: np.array([files[i] for i in index.tolist()], dtype=object),
                       CAPTION: np.array([captions[i] for i in index.tolist()], dtype=object)}
        return Batch(index, torch.full((len(rows),), -1, dtype=torch.int64), inputs,
                     sample_rows=sample_rows, skipped=[i for i, _ in bad])
