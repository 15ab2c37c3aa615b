"""The file format, in one place: dataset names, attribute names, and the rules that make a file
complete, partial, or the run of a given config. The store writes by it; the reader, merge, fit
and gradcam read by it. A reader without this package needs only the layout in DESIGN.md:

    /                 attrs: config (resolved YAML), probe_version, torch_version, created,
                             complete, num_samples, num_committed, layers, hooks, shard_*, ...
    /index (N,)       int64 dataset index of each row
    /target (N,)      int64 the dataset's target, where it has one
    /<layer>/<kind>   (N, *S) attrs: layer, hook, kind, reduce, dtype
    text runs:
    /offsets (N+1,)   int64 sample i's token rows are offsets[i]:offsets[i+1]
    /input_ids (T,)   the token id of each stored token position
    /positions (T,)   its position in the sample (special tokens left out leave gaps)
    /document (T,)    with packing: the dataset index of the document it comes from
    /generated (T,)   generation: bool, true on the rows of generated tokens (after the prompt's)
    /completion (N,)  generation: str, each sample's answer, decoded, special tokens left out
    /loss_mask (T,)   conversations: bool, true on the assistant's tokens
    /role (T,)        conversations: int8, the role of each token's message (attr values)
    /<layer>/<kind>   (T, *S) with tokens=all (attr rows=token), else (N, *S)
    an encoder-decoder's decoder, fed a target (teacher-forced) or generating:
    /decoder_offsets (N+1,)   sample i's decoder rows are decoder_offsets[i]:decoder_offsets[i+1]
    /decoder_input_ids (T',)  the token each decoder row reads (the start token, then the
                      target's); the row's output predicts the next one (or the end)
    /<decoder layer>/<kind>  (T', *S) attrs rows=token, offsets=decoder_offsets
    compact rows (probe.file.encodings):
    /<layer>/<kind>_scale  output.dtype=float8: a float32 scale per row (per query row of an
                      attention pattern); the rows are e4m3 bytes: value = table[byte] * scale
    /transform/<layer>/<kind>/  reduce=pca|srp: mean, components (K, D), explained_variance;
                      a stored row is (x - mean) @ components.T
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

__all__ = [
    "INDEX", "TARGET", "OFFSETS", "INPUT_IDS", "POSITIONS", "DOCUMENT", "FILE", "SKIPPED",
    "DECODER_OFFSETS", "DECODER_INPUT_IDS", "DEFAULT_BOUNDS", "bounds_of",
    "CAPTION", "TRANSCRIPT", "GENERATED", "COMPLETION", "MODALITY", "PATCH", "VALUE_NAMES",
    "LOSS_MASK", "ROLE", "ONSET", "DURATION",
    "TRANSFORM", "SCALE_SUFFIX", "scale_key", "transform_path", "in_transform",
    "ROWS_PER_POSITION", "KINDS", "Attr",
    "DatasetSpec", "FileState", "dataset_key", "split_key", "call_key", "parse_kind",
    "dataset_names", "partial_path", "creating_path", "read_state",
]

INDEX = "index"
TARGET = "target"
OFFSETS = "offsets"
INPUT_IDS = "input_ids"
POSITIONS = "positions"
DOCUMENT = "document"
# an encoder-decoder's decoder rows (a target's tokens, teacher-forced, or an answer's): their
# count differs from the encoder's rows', so they have bounds of their own, which each of
# their datasets names in its attr Attr.OFFSETS
DECODER_OFFSETS = "decoder_offsets"
DEFAULT_BOUNDS = OFFSETS  # what bounds rows per position where their dataset names nothing else
DECODER_INPUT_IDS = "decoder_input_ids"
FILE = "file"  # each row's file, relative to the dataset's root (file-backed datasets)
SKIPPED = "skipped"  # the dataset indices that dataset.on_error=skip left out
CAPTION = "caption"  # each image-text pair's caption
TRANSCRIPT = "transcript"  # each clip's text, where the dataset has a transcript column
GENERATED = "generated"  # generation: whether each token row is a generated token
COMPLETION = "completion"  # generation: each sample's answer, decoded
MODALITY = "modality"  # vision-language models: what each token row is (VALUE_NAMES)
PATCH = "patch"  # vision-language models: an image row's (row, column) on its patch grid
LOSS_MASK = "loss_mask"  # conversations: true on the tokens an assistant wrote
ROLE = "role"  # conversations: the role of the message each token belongs to (VALUE_NAMES)
# timed data (video windows, audio clips, word-timed stories): when a row happened, in
# seconds from the start of its /file. /onset has one value per stored row: per sample where
# rows are samples (a video window's time point), per position where rows are positions (a
# frame's, a token's word's); /duration (N,) is each timed sample's length in seconds
ONSET = "onset"
DURATION = "duration"
TRANSFORM = "transform"  # the group of reduce=pca|srp's transforms, by layer and kind
SCALE_SUFFIX = "_scale"  # output.dtype=float8: <layer>/<kind>_scale holds each row's scale
# the name of each value of a bookkeeping dataset of codes, by value (its attr Attr.VALUES)
VALUE_NAMES = {MODALITY: ("text", "image"), ROLE: ("system", "user", "assistant", "tool")}
ROWS_PER_POSITION = "token"  # the rows attr of a dataset with one row per stored position
# The kinds of value a run stores under <layer>/, each by the name that asks for it in
# hooks=, in the order readers list them: the built-in capture kinds (probe.pipeline.kinds,
# where others may be registered). A kind's name never ends in _<digits>, which numbers a
# module's later calls in one forward pass.
KINDS = {"output": "forward", "input": "forward_pre", "grad_output": "backward",
         "grad_input": "backward_input", "attention": "attention"}


class Attr:
    """Attribute names of the root group and of each layer dataset."""

    # root
    CONFIG = "config"
    COMPLETE = "complete"
    NUM_SAMPLES = "num_samples"
    NUM_COMMITTED = "num_committed"
    NUM_SKIPPED = "num_skipped"  # left-out samples (dataset.on_error=skip) a commit vouches for
    LAYERS = "layers"
    HOOKS = "hooks"
    OBJECTIVE = "objective"
    SHARD_INDEX = "shard_index"
    SHARD_COUNT = "shard_count"
    MERGED_FROM = "merged_from"
    MERGED_ORDER = "merged_order"  # "dataset", or "shards" (text runs: shard after shard)
    DATA_FINGERPRINT = "data_fingerprint"
    MODEL_FINGERPRINT = "model_fingerprint"
    TOKENS = "tokens"  # how token layouts became rows: all, first, last, mean, patches
    INTERVENTIONS = "interventions"  # JSON: the run's interventions, as resolved (+intervene=)
    INTERVENTION_FINGERPRINT = "intervention_fingerprint"  # their digest (vectors, sources)
    ARCHITECTURE = "architecture"  # what the standard names were resolved for (model_type)
    MODULES = "modules"  # JSON: each hooked standard name -> its module's path
    VERIFIED = "verified"  # JSON: each per-run check -> its verdict (probe.families.hf_verify)
    # each "<layer>/<kind>" dataset
    LAYER = "layer"
    MODULE = "module"  # a standard name's dataset: the path of the module it resolved to
    HOOK = "hook"
    KIND = "kind"
    REDUCE = "reduce"
    DTYPE = "dtype"
    TUPLE_POSITION = "tuple_position"
    CALL = "call"  # which run of a module that runs several times per forward pass (from 0)
    ROWS = "rows"  # "token" for a dataset with one row per stored token (else one per sample)
    OFFSETS = "offsets"  # rows per token bounded by another dataset than /offsets: its name
    KEYWORD = "keyword"  # the input was given by this keyword (Llama's hidden_states=...)
    DIMS = "dims"  # the name of each axis: ["sample", "channel", "height", "width"], ...
    CLASSES = "classes"  # root: the class names of a file-backed dataset, by target
    EAGER_ATTENTION = "eager_attention"  # root: the modules whose patterns are stored (eager)
    ATTENTION = "attention"  # an attention pattern's: the implementation that made it (eager)
    KEYS = "keys"  # an attention pattern's key axis: its length, and what lies after a sample's
    VALUES = "values"  # a dataset of codes: the name of each value, by value (VALUE_NAMES)
    # compact rows (probe.file.encodings)
    ENCODING = "encoding"  # float8_e4m3fn: bytes, a value each by DECODE_TABLE times its scale
    DECODE_TABLE = "decode_table"  # float32[256]: the value of each byte
    SCALE = "scale"  # the name (beside it, in its layer's group) of the dataset of scales
    SCALE_OF = "scale_of"  # on a dataset of scales: the kind whose rows it scales
    SCALED_AXES = "scaled_axes"  # how many trailing axes of a row one scale covers
    COMPONENTS = "components"  # reduce=pca|srp: K, the values a row is projected to
    TRANSFORM = "transform"  # reduce=pca|srp: where the transform lies (/transform/<key>)
    FIDELITY_ROWS = "fidelity_rows"  # compact rows: how many were compared with float32 ones
    FIDELITY = ("fidelity_mean_relative_error", "fidelity_max_relative_error",
                "fidelity_min_cosine", "fidelity_cka", "fidelity_explained_variance")


def bounds_of(attrs) -> str:
    """The dataset that bounds each sample's rows of a dataset of rows per token (its attrs):
    /offsets, or the one its ``offsets`` attr names (an encoder-decoder's decoder rows)."""
    return str(attrs.get(Attr.OFFSETS, DEFAULT_BOUNDS))


def dataset_key(layer: str, kind: str) -> str:
    """The dataset that holds ``kind`` of ``layer``: ``"<layer>/<kind>"``."""
    return f"{layer}/{kind}"


def scale_key(key: str) -> str:
    """The dataset of the scales of float8 rows ``key``: ``"<layer>/<kind>_scale"``."""
    return key + SCALE_SUFFIX


def transform_path(key: str) -> str:
    """The group of the transform of the projected rows ``key``: ``/transform/<layer>/<kind>``."""
    return f"{TRANSFORM}/{key}"


def in_transform(name: str) -> bool:
    """Whether ``name`` (a group or dataset path) is the transforms' group or inside it: written
    once, not rows of a layer."""
    return name == TRANSFORM or name.startswith(TRANSFORM + "/")


def split_key(key: str) -> tuple[str, str]:
    """``"<layer>/<kind>"`` as (layer, kind); layer names may hold dots but never a slash."""
    layer, _, kind = key.rpartition("/")
    return layer, kind


def call_key(layer: str, kind: str, call: int = 0) -> str:
    """The dataset of a module's ``call``-th run in one forward pass (counting from 0):
    ``<layer>/<kind>`` for the first, ``<layer>/<kind>_1``, ``_2``, ... for later ones."""
    return dataset_key(layer, kind) + (f"_{call}" if call else "")


def parse_kind(kind: str) -> tuple[str, int]:
    """``output_1`` as (``output``, 1); a kind without a call suffix is call 0."""
    base, _, call = kind.rpartition("_")
    if base and call.isdigit():
        return base, int(call)
    return kind, 0


def dataset_names(group: h5py.Group) -> list[str]:
    """The path of every dataset in a file (or group), at any depth, in HDF5's order."""
    names: list[str] = []
    group.visititems(lambda name, obj: names.append(name)
                     if isinstance(obj, h5py.Dataset) else None)
    return names


def partial_path(path: str | Path) -> Path:
    """Where a run keeps its file until it is complete: ``<path>.partial``."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


def creating_path(path: str | Path) -> Path:
    """Where a run makes its partial file before it holds anything: ``<path>.partial.new``,
    renamed to ``<path>.partial`` once complete in itself."""
    path = Path(path)
    return path.with_name(path.name + ".partial.new")


_RAW_BITS = {"bfloat16": "uint16", "float8_e4m3fn": "uint8"}  # types HDF5 has no name for


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset the store creates before the first row: the shape and type of one row, and
    the attrs that say what it holds."""

    row_shape: tuple[int, ...]
    dtype: str
    attrs: dict = field(default_factory=dict)
    compressible: bool = True  # index and target stay unfiltered, like the rows' bookkeeping
    per_position: bool = False  # one row per stored position (token) instead of per sample
    bounds: str = DEFAULT_BOUNDS  # with per_position: the dataset that bounds its rows

    @property
    def stored_dtype(self) -> np.dtype:
        """The HDF5 type: bfloat16 and float8, which HDF5 lacks, as their raw bits; text as
        UTF-8."""
        if self.dtype == "str":
            return h5py.string_dtype()
        return np.dtype(_RAW_BITS.get(self.dtype, self.dtype))

    @property
    def row_bytes(self) -> int:
        """Bytes a row takes on disk (text: a guess of a file path's length)."""
        itemsize = 64 if self.dtype == "str" else self.stored_dtype.itemsize
        return itemsize * math.prod(self.row_shape)


@dataclass(frozen=True)
class FileState:
    """What the root attrs of a probe file say about its run."""

    path: Path
    config: str
    complete: bool
    num_samples: int
    num_committed: int
    attrs: dict

    @property
    def readable_rows(self) -> int:
        """Rows a reader may use: all of them once complete, else the committed ones."""
        return self.num_samples if self.complete else self.num_committed

    def progress(self) -> str:
        total = "an unknown number of" if self.num_samples < 0 else self.num_samples
        return f"{self.num_committed} of {total} rows"


def read_state(f: h5py.File, path: str | Path | None = None) -> FileState:
    """The state of an open probe file.

    Raises:
        KeyError: the file lacks the attrs every probe file has (it is not one).
    """
    attrs = dict(f.attrs)
    if Attr.CONFIG not in attrs or Attr.NUM_SAMPLES not in attrs:
        missing = Attr.CONFIG if Attr.CONFIG not in attrs else Attr.NUM_SAMPLES
        raise KeyError(f"it has no {missing!r} attribute")
    return FileState(path=Path(path if path is not None else f.filename),
                     config=str(attrs[Attr.CONFIG]),
                     complete=bool(attrs.get(Attr.COMPLETE, False)),
                     num_samples=int(attrs[Attr.NUM_SAMPLES]),
                     num_committed=int(attrs.get(Attr.NUM_COMMITTED, 0)),
                     attrs=attrs)
