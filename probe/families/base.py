"""What a model family does, as four small protocols, and ``Family``: the plain behaviour of
any nn.Module that maps a tensor to (N, classes) logits, which families override where theirs
differs.

    Builds        which family serves a model: ``recognizes``, ``specialise``, ``libraries``
    Preprocesses  the data's preprocessing that the model expects: ``transform``, ``tokenizer``,
                  ``detokenizer``
    FeedsAndReads a batch in, its row layout, the output read: ``place``, ``layout``,
                  ``output_lengths``, ``input_limits``, ``forward``, ``generate``,
                  ``patterns``, ``heads``, ``logits``, ``objective``, ``example_batch``
    Checks        data and layers the model cannot take: ``reads``, ``towers``, ``check``,
                  ``refusal``; the standard layer names and the checks that they hold:
                  ``names``, ``verify``

Every method is given the built model (in eval mode), except the preprocessing, which is
found from the model's config alone (no model is built for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import nn

from probe.config.schema import GenerateConfig, Reduce
from probe.data.feed import Batch, DataKind, Feed, ModelLimits
from probe.data.layouts import RowLayout
from probe.errors import ConfigError
from probe.families.names import StandardNames

__all__ = ["Builds", "Preprocesses", "FeedsAndReads", "Checks", "Family", "Answers", "made_of",
           "first_tensor", "graph_from", "top1", "target", "class_logits"]


@dataclass(frozen=True)
class Answers:
    """What a model generated for a batch of left-padded prompts (``FeedsAndReads.generate``)."""

    sequences: torch.Tensor  # (B, prompt + steps): the prompts as given, then the new tokens
    new: torch.Tensor  # (B,) each sample's new tokens, its end token included; padding after


class Builds(Protocol):
    name: str
    # packages whose classes change only with the package's version (the file records the
    # version, so the model fingerprint leaves their source out)
    libraries: tuple[str, ...]

    def recognizes(self, model: nn.Module) -> bool:
        """Whether ``model`` (built by code outside the family, e.g. a user's model) is made of
        this family's classes."""

    def specialise(self, model: nn.Module) -> Family:
        """The family that serves this built model, in one step: where one library's models
        read different inputs (a Hugging Face checkpoint reads token ids, pixels or sound),
        the one for this model's; ``self`` by default."""


class Preprocesses(Protocol):
    def transform(self, model_cfg: DictConfig) -> Callable | None:
        """The evaluation preprocessing that the model was trained with (for
        ``dataset.transform=auto``); None: the dataset's own default."""

    def tokenizer(self, model_cfg: DictConfig) -> Callable | None:
        """The model's own text tokenizer (for ``dataset.tokenizer=auto``), as a callable
        (list of texts) -> (ids, attention mask), both (B, length) at one fixed length; None:
        the model has none."""

    def detokenizer(self, model_cfg: DictConfig) -> Callable[[list[list[int]]], list[str]] | None:
        """The model's own tokenizer as token ids -> text, special tokens left out (for a
        generated answer); None: the model has none."""


class FeedsAndReads(Protocol):
    def place(self, model: nn.Module, device: torch.device, asked: str
              ) -> tuple[nn.Module, torch.device]:
        """The model on ``device``, and the device its inputs go to."""

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        """The row layout of the model's outputs for ``batch`` (probe.data.layouts): the
        batch's own (its feed's) unless the model lays its positions out itself."""

    def output_lengths(self, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """The model's own count of real output positions for real input lengths (a
        strided stem's), which a feed of such data needs (``Feed.for_model``); None where the
        outputs keep the input's positions."""

    def input_limits(self, model: nn.Module) -> ModelLimits:
        """The most the model's inputs can hold (positions, token ids), which the feed checks
        every sample against before the run (``Feed.check_fits``)."""

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        """The model's output for a batch on the device; with ``input_grad`` the autograd graph
        starts at the input itself."""

    def generate(self, model: nn.Module, inputs: dict, settings: GenerateConfig,
                 all_logits: bool = False) -> Answers:
        """The model's own generation on a batch's ``inputs`` (prompts padded on the left),
        with the hooks on: every step, and one more that feeds the last new token, so that
        the hooks see each token's position once. ``all_logits``: the prompt's step computes
        every position's logits (where the model would compute the last one's alone).

        Raises:
            ConfigError: the model does not generate, saying which would.
        """

    def decodes_answers(self, model: nn.Module) -> bool:
        """Whether the model's answers are its decoder's (an encoder-decoder): its prompts go
        to its encoder as fed, ``generate`` gives the decoder's sequences (its start token,
        then the new ones), and the answers' rows are the decoder's steps
        (probe.pipeline.generation_decoded); else a prompt and its answer are one sequence."""

    def patterns(self, model: nn.Module, hooked: Mapping[nn.Module, str],
                 on_pattern: Callable[[str, torch.Tensor], None] | None
                 ) -> AbstractContextManager[dict[str, tuple[int, int, int]]]:
        """For a block, the ``hooked`` attention modules (module -> name) give their
        post-softmax weights, (B, heads, queries, keys), to ``on_pattern(name, weights)``,
        the rest of the model computing as before; yields, as the block runs, every module
        that computed attention (name -> heads, queries, keys).

        Raises:
            ConfigError: the model's attention gives no patterns.
        """

    def heads(self, model: nn.Module, name: str) -> tuple[str, int]:
        """Where the heads of attention module ``name`` are: the name of the projection whose
        input is every head's output side by side, and how many heads there are (for
        ``do: heads`` interventions).

        Raises:
            ConfigError: the family cannot say, naming what would work.
        """

    def logits(self, output) -> torch.Tensor | None:
        """The logits in the model's output, or None."""

    def objective(self, name: str, model: nn.Module) -> Callable:
        """The named objective as (output, batch) -> one value per sample.

        Raises:
            ConfigError: a name this model cannot give, saying what it needs.
        """

    def example_batch(self, model: nn.Module) -> Batch | None:
        """A batch of the model's own making, for listing its layers without a dataset; None
        where it needs data."""


class Checks(Protocol):
    reads: tuple[DataKind, ...]  # the kinds of data the model reads
    # the model's towers, each by its top-level module names, where it has several that
    # different data runs (a two-tower model's vision and text); empty otherwise
    towers: Mapping[str, tuple[str, ...]]

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        """Refuse data that this model cannot read (``feed``: the dataset's), and layers that
        this data does not run or whose reduce it cannot honour (``reduces``: each hooked
        layer's).

        Raises:
            ConfigError: saying which data the model reads, or which layers the data runs.
        """

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        """The line for data of a kind the model does not read: what it reads, and the
        dataset to give it."""

    def names(self, model: nn.Module) -> StandardNames | None:
        """What the standard layer names (``blocks.6``, ``lm_head``: probe.families.names)
        mean for this model; None where the family has none."""

    def verify(self, model: nn.Module, batch: Batch, hooked: Mapping[str, str],
               attention: bool) -> dict[str, str]:
        """The per-run checks of the standard names that a run hooks (``hooked``: name ->
        module path; ``attention``: whether it stores attention patterns), on the dry run's
        ``batch`` on the device: each check -> its verdict in words ({} where the family
        checks nothing).

        Raises:
            ConfigError: a check that fails, naming the architecture and the check.
        """


class Family:
    """Any nn.Module that maps a tensor to (N, classes) logits; families override what differs
    (see the module's docstring)."""

    name = "torch"
    libraries: tuple[str, ...] = ()
    reads: tuple[DataKind, ...] = tuple(DataKind)
    towers: Mapping[str, tuple[str, ...]] = MappingProxyType({})

    def recognizes(self, model: nn.Module) -> bool:
        return False

    def specialise(self, model: nn.Module) -> Family:
        return self

    def transform(self, model_cfg: DictConfig) -> Callable | None:
        return None

    def tokenizer(self, model_cfg: DictConfig) -> Callable | None:
        return None

    def detokenizer(self, model_cfg: DictConfig) -> Callable[[list[list[int]]], list[str]] | None:
        return None

    def place(self, model: nn.Module, device: torch.device, asked: str
              ) -> tuple[nn.Module, torch.device]:
        return model.to(device), device

    def layout(self, model: nn.Module, batch: Batch) -> RowLayout:
        return batch.layout

    def output_lengths(self, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return None

    def input_limits(self, model: nn.Module) -> ModelLimits:
        return ModelLimits(model=type(model).__name__)

    def forward(self, model: nn.Module, batch: Batch, *, input_grad: bool = False):
        inputs = batch.inputs
        if input_grad:
            inputs = inputs.requires_grad_()
        return model(**inputs) if isinstance(inputs, dict) else model(inputs)

    def generate(self, model: nn.Module, inputs: dict, settings: GenerateConfig,
                 all_logits: bool = False) -> Answers:
        raise ConfigError(f"generate.max_new_tokens={settings.max_new_tokens}: "
                          f"{type(model).__name__} does not generate text; use a language model "
                          "with a causal_lm head (model=transformers model.name=...), or set "
                          "generate.max_new_tokens=0")

    def decodes_answers(self, model: nn.Module) -> bool:
        return False

    def patterns(self, model: nn.Module, hooked: Mapping[nn.Module, str],
                 on_pattern: Callable[[str, torch.Tensor], None] | None
                 ) -> AbstractContextManager[dict[str, tuple[int, int, int]]]:
        raise ConfigError(f"hooks=[attention]: {type(model).__name__}'s attention gives no "
                          "patterns here; they come from Hugging Face models "
                          "(model=transformers), whose hooked attention modules run eager")

    def heads(self, model: nn.Module, name: str) -> tuple[str, int]:
        raise ConfigError(f"{type(model).__name__}'s family cannot say where an attention "
                          "module's heads are (Hugging Face models' can); use do: zero or do: "
                          "mean on the module instead")

    def logits(self, output) -> torch.Tensor | None:
        return first_tensor(output)[0]

    def objective(self, name: str, model: nn.Module) -> Callable:
        if name == "nll":
            raise ConfigError("objective=nll is a language model's next-token loss; this model "
                              "gives class logits: use objective=top1 or target (nll needs "
                              "model=transformers with dataset=text)")
        if name == "similarity":
            raise ConfigError("objective=similarity is the matched image-text logit of a "
                              "two-tower model; this model gives class logits: use "
                              "objective=top1 or target (similarity needs a CLIP-like "
                              "model.name with dataset=pairs)")
        if name not in ("top1", "target"):
            raise ConfigError(f"objective={name!r} is unknown; use top1, target, or a config "
                              "with a _target_ callable (logits, targets) -> one value per "
                              "sample")
        function = top1 if name == "top1" else target
        return lambda output, batch: function(class_logits(self.logits(output)), batch.target)

    def example_batch(self, model: nn.Module) -> Batch | None:
        return None

    def check(self, model: nn.Module, feed: Feed, reduces: Mapping[str, Reduce]) -> None:
        if feed.kind not in self.reads:
            raise ConfigError(self.refusal(model, feed))

    def names(self, model: nn.Module) -> StandardNames | None:
        return None

    def verify(self, model: nn.Module, batch: Batch, hooked: Mapping[str, str],
               attention: bool) -> dict[str, str]:
        return {}

    def refusal(self, model: nn.Module, feed: Feed) -> str:
        kinds = ", ".join(kind.value for kind in self.reads)
        return (f"{type(model).__name__} reads {kinds}, not {feed.kind.value}; use a dataset "
                "of those")


def made_of(model: nn.Module, package: str) -> bool:
    """Whether any module of ``model`` is a class of ``package`` (a model of one's own made of
    a library's classes is that library's)."""
    return any(type(m).__module__.startswith(f"{package}.") for m in model.modules())


def first_tensor(value) -> tuple[torch.Tensor | None, int | None]:
    """The first tensor of a module's output or input (what a hook stores, and a plain model's
    logits), and its position in a tuple (None when the value is a tensor itself)."""
    if isinstance(value, torch.Tensor):
        return value, None
    if isinstance(value, (tuple, list)):
        for position, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                return item, position
    return None, None


@contextmanager
def graph_from(module: nn.Module | None, active: bool = True) -> Iterator[None]:
    """While the block runs (and ``active``), ``module``'s output is a fresh leaf that requires
    grad, so the autograd graph starts there: token ids have no gradient, the embeddings that
    look them up do. Nothing is done for no module."""
    handle = module.register_forward_hook(_leaf) if active and module is not None else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


def _leaf(module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
    return output.detach().requires_grad_()


def top1(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logit of each sample's predicted class."""
    return logits.gather(1, logits.argmax(1, keepdim=True)).squeeze(1)


def target(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logit of each sample's target class (the dataset's label)."""
    return logits.gather(1, targets.to(logits.device).view(-1, 1)).squeeze(1)


def class_logits(logits: torch.Tensor | None) -> torch.Tensor:
    """``logits`` checked to be (batch, classes).

    Raises:
        ConfigError: they are not.
    """
    if logits is None or logits.dim() != 2:
        shape = None if logits is None else tuple(logits.shape)
        raise ConfigError(
            f"the objective needs the model's output as (batch, classes) logits, got {shape}; "
            "use a classification model or an objective _target_ that reads this output"
        )
    return logits
