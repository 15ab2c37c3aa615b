"""Images with text: ``dataset=pairs dataset.path=pairs.csv``.

A csv or jsonl file has one sample a row: an image file (``image_column``, relative to the
file's folder or absolute; a jsonl list for several images) and its text (``text_column``).
The model's family says what the text is, by the encoder it hands over as
``tokenizer=auto`` (``PairEncoder``):

- a two-tower model (CLIP, SigLIP, open_clip): a caption (``CaptionPairs``): the image through
  the model's own preprocessing (``transform=auto``) and the caption through its own
  tokenizer, padded to the text tower's length, so that a batch feeds both towers at once
  (``objective=similarity``: each pair's matched logit); a row per pair;
- a vision-language model (LLaVA, Qwen2-VL, ...): a prompt, which the checkpoint's own
  processor makes into the model's inputs with the images (probe.families.hf_vlm); the
  language model's rows are its positions (image placeholders included).

Rows keep each sample's image file (``/file``) and text (``/caption``).

    data = PairsDataset("pairs.csv", transform=image_processor, tokenizer=caption_tokenizer)
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset

from probe.data.feed import Batch, DataKind, bad_sample
from probe.data.layouts import SAMPLE_ROWS, RowLayout
from probe.data.tensors import TensorFeed
from probe.errors import ConfigError, DataError
from probe.file.format import CAPTION, FILE, Attr, DatasetSpec

__all__ = ["PairsDataset", "PairsFeed", "PairEncoder", "CaptionPairs"]

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
        return dataset.encoder.attrs()

    def describe(self, batch: Batch) -> str:
        inputs = batch.inputs
        return (f"images of shape {tuple(inputs['pixel_values'].shape[1:])} and "
                f"{inputs['input_ids'].shape[1]} tokens")

    @staticmethod
    def _rows(dataset: PairsDataset, indices: list[int], skip_bad: bool = False):
        return _Rows(dataset, indices, skip_bad=skip_bad)


@runtime_checkable
class PairEncoder(Protocol):
    """How a sample's images and text become the model's inputs (see the module's
    docstring); picklable, for loader workers."""

    def item(self, images: list, text: str, where: str) -> Any:
        """One sample's images (PIL, RGB) and text, as its loader worker prepares them
        (``where`` names the sample, for a message).

        Raises:
            DataError: a sample this encoder cannot take, in one line.
        """

    def collate(self, items: list) -> tuple[dict, RowLayout]:
        """A batch of items as the model's keyword inputs, and the row layout of its
        positions."""

    def attrs(self) -> dict:
        """Root attrs that say how the samples were prepared."""

    def prepared(self, chat_template: str | bool) -> PairEncoder:
        """This encoder with the dataset's ``chat_template`` setting (auto, true, false).

        Raises:
            ConfigError: a setting this model cannot honour.
        """


class CaptionPairs:
    """A two-tower model's pairs: ``transform`` makes the image's pixels, ``tokenizer``
    (captions -> (ids, attention mask) at one length) the caption's tokens; a row per
    pair."""

    def __init__(self, transform: Callable, tokenizer: Callable):
        self.transform, self.tokenizer = transform, tokenizer

    def item(self, images: list, text: str, where: str) -> dict:
        if len(images) != 1:
            raise DataError(f"{where} has {len(images)} images; a two-tower model pairs one "
                            "image with its caption")
        ids, mask = self.tokenizer([text])
        return {"pixel_values": self.transform(images[0]), "input_ids": ids[0],
                "attention_mask": mask[0]}

    def collate(self, items: list[dict]) -> tuple[dict, RowLayout]:
        return ({key: torch.stack([item[key] for item in items])
                 for key in ("pixel_values", "input_ids", "attention_mask")}, SAMPLE_ROWS)

    def prepared(self, chat_template: str | bool) -> CaptionPairs:
        if str(chat_template).lower() == "true":
            raise ConfigError("dataset.chat_template=true: a two-tower model has no chat "
                              "template (its text is a caption); leave it auto")
        return self

    def attrs(self) -> dict:
        from probe.data.transforms import describe_transform

        return {"transform": json.dumps(describe_transform(self.transform)),
                "tokenizer": repr(self.tokenizer)}


class PairsDataset(Dataset):
    """The samples of a csv or jsonl file (see the module's docstring).

    Args:
        path: the csv or jsonl file.
        image_column: the column of image files, relative to the file's folder or absolute.
        text_column: the column of captions.
        transform: the image preprocessing of a two-tower model (probe.families.build passes
            the model's own for ``auto``); ``imagenet``: the ImageNet evaluation transform at
            ``image_size``. A vision-language model's processor prepares its images itself.
        tokenizer: the model's own text encoding, passed by probe.families.build for ``auto``:
            captions -> (ids, attention mask) at one length (a two-tower model's), or a
            ``PairEncoder`` (a vision-language model's processor).
        image_size: the crop of the ImageNet transform.
        chat_template: a prompt goes to a vision-language model through its processor's chat
            template (a user turn of the images and the text): ``auto`` where the processor
            has one, ``true`` (it must), ``false`` (the prompt as it is). A prompt that holds
            the image placeholder already is passed as it is.

    Raises:
        DataError: the file does not exist or cannot be read.
        ConfigError: a column that the file lacks, no tokenizer, a chat template asked of a
            model without one.
    """

    feed = PairsFeed()

    def __init__(self, path: str, image_column: str = "image", text_column: str = "text",
                 transform: str | Callable = "auto", tokenizer: str | Callable = "auto",
                 image_size: int = 224, chat_template: str | bool = "auto"):
        from probe.data.transforms import imagenet_transform, resolve_transform

        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise DataError(f"dataset.path={str(path)!r}: no such file; pass a csv or jsonl of "
                            "image paths and captions")
        if not callable(tokenizer) and not isinstance(tokenizer, PairEncoder):
            raise ConfigError(f"dataset.tokenizer={tokenizer!r}: dataset=pairs tokenizes the "
                              "text with the model's own tokenizer or processor "
                              "(tokenizer=auto), which this model does not have; use "
                              "model=transformers (CLIP, SigLIP, a vision-language model) or "
                              "model=open_clip")
        if isinstance(tokenizer, PairEncoder):  # a vision-language model's processor
            if str(transform) != "auto":
                raise ConfigError(f"dataset.transform={transform!r}: a vision-language model's "
                                  "processor prepares its images itself; leave "
                                  "dataset.transform=auto")
            encoder = tokenizer
        else:
            encoder = CaptionPairs(
                resolve_transform(transform, lambda: imagenet_transform(image_size)), tokenizer)
        self.encoder = encoder.prepared(chat_template)
        self.rows = _read_rows(self.path)
        for key, column in (("image_column", image_column), ("text_column", text_column)):
            if self.rows and column not in self.rows[0]:
                raise ConfigError(f"dataset.{key}={column!r} is not a column of {self.path}; "
                                  f"it has {', '.join(map(str, self.rows[0]))}")
        self.images = [_files(row[image_column]) for row in self.rows]
        self.files = [";".join(files) for files in self.images]
        self.captions = [str(row[text_column]) for row in self.rows]

    @property
    def transform(self):
        return getattr(self.encoder, "transform", None)

    @property
    def tokenizer(self):
        return getattr(self.encoder, "tokenizer", None)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int):
        from PIL import Image

        images = []
        for name in self.images[index]:
            file = Path(name).expanduser()
            with Image.open(file if file.is_absolute() else self.path.parent / file) as image:
                images.append(image.convert("RGB"))
        return self.encoder.item(images, self.captions[index],
                                 f"dataset sample {index} ({self.files[index]})")

    def fingerprint(self) -> dict:
        """The samples themselves (files, their sizes, and texts), for a resumed run's
        check."""
        lines = "\n".join(f"{f}:{_sizes(self.path.parent, f)}\t{c}"
                          for f, c in zip(self.files, self.captions, strict=True))
        return {"files": hashlib.sha256(lines.encode()).hexdigest()[:16]}


def _files(value) -> list[str]:
    # one image file, or (a jsonl list) several
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _sizes(folder: Path, files: str) -> str:
    sizes = []
    for name in files.split(";"):
        path = Path(name).expanduser()
        path = path if path.is_absolute() else folder / path
        sizes.append(str(path.stat().st_size) if path.is_file() else "-")
    return ",".join(sizes)


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
        inputs, layout = (self.dataset.encoder.collate([item for _, item in rows]) if rows
                          else ({}, SAMPLE_ROWS))
        files, captions = self.dataset.files, self.dataset.captions
        sample_rows = {FILE: np.array([files[i] for i in index.tolist()], dtype=object),
                       CAPTION: np.array([captions[i] for i in index.tolist()], dtype=object)}
        return Batch(index, torch.full((len(rows),), -1, dtype=torch.int64), inputs,
                     layout=layout, sample_rows=sample_rows, skipped=[i for i, _ in bad])
