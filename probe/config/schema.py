"""The config schema, checked by Hydra when a config is composed, and the one home of every
default: ``conf/config.yaml`` picks the groups and sets Hydra's options, the values are here.

A mistyped key or a value of the wrong type fails at composition with Hydra's own message; a key
added with ``+`` is refused by ``check_known_keys``. Nothing here imports Hydra
(probe.config.compose registers the schema). Which keys change what a file stores is the file
format's to say (probe.file.recorded): they are imported from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from omegaconf import MISSING

from probe.errors import ConfigError
from probe.file.recorded import MOVED_TARGETS, NEUTRAL_KEYS, differing_keys

__all__ = [
    "Reduce",
    "Dtype",
    "Tokens",
    "Compression",
    "Subset",
    "GeneratedRows",
    "GenerateConfig",
    "ProbeConfig",
    "NEUTRAL_KEYS",
    "differing_keys",
    "member",
    "MOVED_TARGETS",
]


class Reduce(str, Enum):
    """How a captured (N, C, ...) tensor is reduced before it is stored (the reduce attr)."""

    none = "none"
    mean = "mean"
    max = "max"
    flatten = "flatten"
    # the row flattened, then projected on reduce_components axes (probe.pipeline.compact)
    pca = "pca"
    srp = "srp"

    @property
    def projects(self) -> bool:
        """Whether the rows are projected (pca, srp): flattened, then mapped to K values."""
        return self in (Reduce.pca, Reduce.srp)


class Tokens(str, Enum):
    """Which rows an output with a token axis, (batch, tokens, ...), gives: one per token, or
    one per sample (the tokens attr); ``patches``: a vision transformer's patch tokens alone
    (no class or register tokens), one (features, rows, columns) map per sample."""

    all = "all"
    first = "first"
    last = "last"
    mean = "mean"
    patches = "patches"


_E = TypeVar("_E", bound=Enum)


def member(enum: type[_E], value: str | _E, label: str) -> _E:
    """``value`` as a member of ``enum``, looked up by name.

    Raises:
        ConfigError: naming ``label`` and every member.
    """
    if isinstance(value, enum):
        return value
    if str(value) not in enum.__members__:
        raise ConfigError(f"{label} is unknown; use any of {', '.join(enum.__members__)}")
    return enum[str(value)]


class Dtype(str, Enum):
    """A floating-point type, as configs name it (output.dtype, model.dtype)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    # output.dtype only: e4m3 bytes with a float32 scale per row (probe.pipeline.compact)
    float8 = "float8"

    @property
    def torch(self):
        """The torch dtype (torch is imported only when this is asked)."""
        import torch

        return torch.float8_e4m3fn if self is Dtype.float8 else getattr(torch, self.value)


class Subset(str, Enum):
    """Which samples ``limit`` takes."""

    first = "first"
    random = "random"


class Compression(str, Enum):
    none = "none"
    lzf = "lzf"
    gzip = "gzip"
    zstd = "zstd"


@dataclass
class ShardConfig:
    # this job takes every sample i (after `limit`) with i % count == index
    index: int = 0
    count: int = 1


@dataclass
class OutputConfig:
    # the HDF5 file; null means <Hydra run dir>/features.h5
    path: str | None = None
    # replace a file that holds another config's run (otherwise such a file is refused)
    overwrite: bool = False
    # stored element type; bfloat16 is kept as its raw 16-bit pattern (HDF5 has no bfloat16),
    # with the dataset's dtype attr saying so; probe.open reads it back as float32, exactly;
    # float8: e4m3 bytes and a float32 scale per row (<layer>/<kind>_scale), decoded on read
    dtype: Dtype = Dtype.float32
    # rows of each key kept in float32 beside their compact form (float8, float16, bfloat16,
    # pca, srp) to measure what was lost (the fidelity_* attrs); 0: no report
    fidelity_rows: int = 256
    # HDF5 filter; zstd needs the `zstd` extra (hdf5plugin)
    compression: Compression = Compression.none
    # gzip level 0-9 or zstd level 1-22; null means the filter's default
    compression_level: int | None = None
    # rows become durable (resumable after a crash) every this many batches or seconds
    commit_every: int = 8
    commit_seconds: float = 5.0
    # refuse to start a run whose estimated size exceeds the free disk space
    check_free_space: bool = True
    # HDF5 file locking: null (HDF5's default, or HDF5_USE_FILE_LOCKING), true, false, or
    # best-effort; false or best-effort on file systems where locking fails (some NFS mounts)
    file_locking: Any = None


class GeneratedRows(str, Enum):
    """Which token rows a generating run stores (generate.rows): the prompt's and the answer's,
    or one of the two; ``tokens=first|last|mean`` pool over those."""

    all = "all"
    prompt = "prompt"
    answer = "answer"


@dataclass
class GenerateConfig:
    # new tokens each prompt gets from the model's own generate(), with the hooks on through
    # every step; 0: no generation (the prompt is read, as any text)
    max_new_tokens: int = 0
    # sample (seeded by `seed`, batch by batch) instead of taking the most likely token
    do_sample: bool = False
    # with do_sample: null keeps the checkpoint's generation config
    temperature: float | None = None
    top_p: float | None = None
    # stop a sample at its end token (kept as its last row); false: always max_new_tokens
    stop_at_eos: bool = True
    # the token rows stored: all (the prompt's, then the answer's), prompt, or answer
    rows: GeneratedRows = GeneratedRows.all


@dataclass
class ProbeConfig:
    # `_target_` of a torch.nn.Module factory; see conf/model/
    model: Any = MISSING
    # `_target_` of a torch Dataset whose items are a tensor or (tensor, target); see conf/dataset/
    dataset: Any = MISSING
    # module paths as model.named_modules() names them; shell-style globs allowed
    layers: list[str] = field(default_factory=list)
    # what to capture at each layer, by capture kind (probe.pipeline.kinds): forward,
    # forward_pre, backward, backward_input, attention, or a kind registered there
    hooks: list[str] = field(default_factory=lambda: ["forward"])
    # the scalar per sample that backward hooks differentiate: top1, target, nll, similarity
    # (the model's family says which it gives) or a `_target_`
    objective: Any = "top1"
    # reduction of each captured tensor before storage
    reduce: Reduce = Reduce.none
    # reduce=pca|srp: the values each row is projected to
    reduce_components: int | None = None
    # reduce=pca: the samples (the first of the selection, before sharding) whose rows the
    # principal axes are fitted on, in a pass before the run's
    reduce_fit_samples: int = 256
    # outputs with (batch, sequence) leading axes (language models, vision transformers): all
    # (one row per real token; padding is never stored), first, last (the last real token),
    # or mean (over the real tokens): one row per sample; patches: a vision transformer's
    # patch tokens alone (no class or register tokens) as (N, features, rows, columns)
    tokens: Tokens = Tokens.all
    # exceptions to `reduce`, {layer name or glob: reduce}, e.g. {layer4: none}; a layer's own
    # name beats a glob. Typed Any with a null default: Hydra merges a dict from the command line
    # into an existing (typed) one, where struct mode refuses new keys; the runner checks values.
    reduce_by_layer: Any = None
    # forward-only runs stop each forward pass once every hooked module has run (false: run it all)
    stop_early: bool = True
    # check, on the dry run's sample, that the standard layer names hooked (blocks.6, lm_head)
    # are the modules they name (probe.families.hf_verify); false skips it, and the file says so
    verify: bool = True
    # auto | cpu | cuda | cuda:N | mps
    device: str = "auto"
    batch_size: int = 16
    # language models: a budget of padded token positions per batch, instead of batch_size
    # documents (batch_size still sizes the windows that bucket_by_length sorts)
    batch_tokens: int | None = None
    # language models: batch documents of similar length together (far less padding); the
    # rows are still stored in dataset order
    bucket_by_length: bool = True
    num_workers: int = 0
    # take only `limit` samples of the dataset; null means all
    limit: int | None = None
    # which `limit` samples: the first ones, or a random choice (seeded by `seed`; rows stay in
    # dataset order). `random` suits a folder sorted by class, whose first samples are one class
    subset: Subset = Subset.first
    # seeds the random init of models without weights, the synthetic dataset and subset=random
    seed: int = 0
    shard: ShardConfig = field(default_factory=ShardConfig)
    # a language model answers each prompt (generate.max_new_tokens > 0): see GenerateConfig
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    # the model run under a change: +intervene=<name> picks conf/intervene/<name>.yaml (or a
    # --config-dir's), a list of {at, do, ...} (probe.pipeline.interventions.config); null: none
    intervene: Any = None

    @property
    def skip_bad(self) -> bool:
        """Whether samples that cannot be loaded are left out (``dataset.on_error=skip``)."""
        return str((self.dataset or {}).get("on_error", "raise")) == "skip"
