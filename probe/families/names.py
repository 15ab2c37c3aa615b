"""Standard layer names: one set of names across architectures, each resolved to the real
module path of one model.

    blocks.6            the 7th block of the model's stack (blocks.-1: the last one)
    blocks.*            every block
    blocks.50%          the block half-way down: the one whose output is hidden_states[6] of
                        12 (the block whose output lies at that fraction of the depth)
    blocks.6.attention  the module whose weights hooks=[attention] stores
    blocks.6.mlp        the block's feed-forward (or mixture of experts)
    embeddings          the token embedding (before positions are added)
    final_norm          the norm after the last block
    lm_head             the next-token head of a language model
    encoder.blocks.1, decoder.blocks.1, decoder.blocks.1.cross_attention, encoder.embeddings,
    decoder.final_norm  the stacks of an encoder-decoder
    vision.blocks.1     the vision tower of a vision-language model (blocks.N: its language
                        model)

A family says what each name means for a built model (``Family.names``, a ``StandardNames``
that probe.families.hf_names makes for Hugging Face models); ``expand`` turns a name of the
config's ``layers`` into (name, module path) pairs, or says in one line why the model has no
such part. A module that the model itself names like a standard name wins: real paths keep
working as they did.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from probe.errors import ConfigError

__all__ = ["StandardNames", "Stack", "is_standard", "SINGLES", "BLOCK_PARTS", "STACKS"]

SINGLES = ("embeddings", "final_norm", "lm_head")  # one module per stack
BLOCK_PARTS = ("attention", "cross_attention", "mlp")  # one module per block
STACKS = ("encoder", "decoder", "vision")  # the prefixes of stacks beside the main one

_INDEX = r"(?P<index>\*|-?\d+|\d+(?:\.\d+)?%)"
_NAME = re.compile(rf"^(?:(?P<stack>{'|'.join(STACKS)})\.)?"
                   rf"(?:blocks\.{_INDEX}(?:\.(?P<part>{'|'.join(BLOCK_PARTS)}))?"
                   rf"|(?P<single>{'|'.join(SINGLES)}))$")


def is_standard(pattern: str) -> bool:
    """Whether ``pattern`` is written as a standard name (whatever a model has of it)."""
    return _NAME.match(pattern) is not None


@dataclass(frozen=True)
class Stack:
    """One stack of blocks: each block's module path, and its parts' (None: the block has no
    such part, with the reason in ``missing``)."""

    blocks: tuple[str, ...]
    parts: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)
    singles: Mapping[str, str | None] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)  # part or single -> why not


@dataclass(frozen=True)
class StandardNames:
    """What the standard names mean for one model (see the module's docstring).

    ``stacks`` by prefix: "" for the main one (a decoder's or an encoder's; the language
    model of a vision-language model), "encoder" and "decoder" for an encoder-decoder,
    "vision" for a vision tower. ``refused``: a reason that the model has no standard names
    at all, or none of blocks (a model that shares one block over its depth).
    """

    architecture: str  # what messages call the model (its model_type)
    stacks: Mapping[str, Stack] = field(default_factory=dict)
    refused: str | None = None
    notes: Mapping[str, str] = field(default_factory=dict)  # module path -> what to know of it

    def expand(self, pattern: str) -> list[tuple[str, str]]:
        """The (standard name, module path) pairs that ``pattern`` names, in depth order.

        Raises:
            ConfigError: a name the model has no part for, or an index beyond the depth, in
                one line that names the depth or the parts the model has.
        """
        found = _NAME.match(pattern)
        if found is None:
            raise ValueError(f"{pattern!r} is not a standard name")
        if self.refused is not None:
            raise ConfigError(f"{pattern} is a standard name, but {self.refused}")
        prefix = found["stack"] or ""
        stack = self.stacks.get(prefix)
        if stack is None:
            raise ConfigError(self._no_stack(pattern, prefix))
        head = f"{prefix}." if prefix else ""
        if found["single"]:
            single = found["single"]
            path = stack.singles.get(single)
            if path is None:
                why = stack.missing.get(single, "it has no such module")
                raise ConfigError(f"{pattern} on {self.architecture}: {why}")
            return [(pattern, path)]
        indices = self._indices(pattern, found["index"], len(stack.blocks))
        part = found["part"]
        pairs = []
        for n in indices:
            name = f"{head}blocks.{n if found['index'] == '*' else found['index']}"
            path = stack.blocks[n]
            if part is not None:
                name, path = f"{name}.{part}", stack.parts.get(part, (None,) * (n + 1))[n]
                if path is None:
                    if found["index"] == "*":
                        continue  # blocks.*.attention: the blocks that have attention
                    why = stack.missing.get(part, f"its blocks have no {part} module")
                    raise ConfigError(f"{pattern} on {self.architecture}: block {n} has no "
                                      f"{part}: {why}")
            pairs.append((name, path))
        if not pairs:
            why = stack.missing.get(part, f"its blocks have no {part} module")
            raise ConfigError(f"{pattern} on {self.architecture}: {why}")
        return pairs

    def _indices(self, pattern: str, index: str, depth: int) -> list[int]:
        if index == "*":
            return list(range(depth))
        if index.endswith("%"):
            fraction = float(index[:-1]) / 100
            if not 0 < fraction <= 1:
                raise ConfigError(f"{pattern}: a depth fraction is above 0% and at most 100% "
                                  f"(blocks.50% is the block half-way down)")
            # the block whose output lies at that fraction of the depth: hidden_states[k], k
            # the fraction of the depth rounded half up, is the output of block k - 1
            return [max(math.floor(fraction * depth + 0.5), 1) - 1]
        n = int(index)
        if not -depth <= n < depth:
            raise ConfigError(f"{pattern} on {self.architecture}: {self._stack_name(pattern)} "
                              f"has {depth} blocks, blocks.0 to blocks.{depth - 1} (blocks.-1 "
                              "is the last)")
        return [n % depth]

    @staticmethod
    def _stack_name(pattern: str) -> str:
        prefix = pattern.split(".")[0]
        return f"its {prefix}" if prefix in STACKS else "it"

    def _no_stack(self, pattern: str, prefix: str) -> str:
        have = [p for p in self.stacks if p]
        if not prefix:
            named = " or ".join(f"{p}.{pattern}" for p in have)
            return (f"{pattern} on {self.architecture}, an encoder-decoder: name the stack, "
                    f"{named}")
        if prefix == "vision":
            return f"{pattern} on {self.architecture}: it has no vision tower"
        if "" in self.stacks:
            return (f"{pattern} on {self.architecture}: it has one stack of blocks, not an "
                    "encoder and a decoder; name it without the prefix, "
                    f"{pattern.removeprefix(prefix + '.')}")
        return (f"{pattern} on {self.architecture}: it has no {prefix}; its stacks are "
                f"{', '.join(have)}")

    def table(self) -> dict[str, str]:
        """Every standard name of this model (block parts of every block) -> module path."""
        names = {}
        for prefix, stack in self.stacks.items():
            head = f"{prefix}." if prefix else ""
            for single, path in stack.singles.items():
                if path is not None:
                    names[f"{head}{single}"] = path
            for n, block in enumerate(stack.blocks):
                names[f"{head}blocks.{n}"] = block
                for part, paths in stack.parts.items():
                    if paths[n] is not None:
                        names[f"{head}blocks.{n}.{part}"] = paths[n]
        return names

    def depth(self, prefix: str = "") -> int:
        """The blocks of a stack (0 where the model has no such stack)."""
        stack = self.stacks.get(prefix)
        return 0 if stack is None else len(stack.blocks)
