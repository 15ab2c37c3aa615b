"""The ``intervene`` config group, read: a list of interventions, each one line of YAML that says
where (``at``: a module), what (``do``) and at which positions, with only the keys that its
operation needs::

    # conf/intervene/steer_honesty.yaml (or my_conf/intervene/..., with --config-dir my_conf)
    - {at: transformer.h.6, do: add, vector: honesty.npy, alpha: 4.0, positions: answer}
    - {at: transformer.h.2.attn, do: heads, heads: [0, 3]}

``read_interventions(value)`` checks every item before a model is built: a key that its
operation does not take, a missing one, a value of the wrong type is one line naming the item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from probe.errors import ConfigError
from probe.pipeline.interventions.operations import OPERATIONS

__all__ = ["Intervention", "read_interventions", "NAMED_POSITIONS"]

NAMED_POSITIONS = ("all", "prompt", "answer", "last")


@dataclass(frozen=True)
class Intervention:
    """One change to one module's output (``heads``: to its heads' part of the input of the
    projection that joins them), at ``positions``: all, prompt, answer, last, or a tuple of
    a sample's own positions (from 0; negative ones count back from its last prompt token)."""

    at: str
    do: str
    positions: str | tuple[int, ...] = "all"
    vector: str | None = None  # a .npy file, or <probe file>.h5:<key>
    alpha: float = 1.0
    heads: tuple[int, ...] = ()
    source: str | None = None  # the probe file of ``from``

    @property
    def label(self) -> str:
        """The intervention in a few words, for messages and the log."""
        heads = f" {list(self.heads)}" if self.heads else ""
        return f"{self.do}{heads} at {self.at}"


def read_interventions(value) -> list[Intervention]:
    """The interventions that the ``intervene`` group holds (None or [] for none).

    Raises:
        ConfigError: an item that is not one, in one line naming it and the fix.
    """
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"intervene={value!r} is not a list of interventions; write each as "
                          "{at: <module>, do: zero|mean|heads|add|scale|patch, ...} in "
                          "conf/intervene/<name>.yaml and pick it with +intervene=<name>")
    return [_item(n, item) for n, item in enumerate(value)]


def _item(n: int, item) -> Intervention:
    where = f"intervene[{n}]"
    if not isinstance(item, dict) or not isinstance(item.get("at"), str) or not item["at"]:
        raise ConfigError(f"{where}={item!r} needs at: <module> (python -m probe.layers lists "
                          "the modules) and do: " + "|".join(OPERATIONS))
    where = f"{where} (at {item['at']})"
    do = item.get("do")
    if do not in OPERATIONS:
        raise ConfigError(f"{where}: do={do!r} is unknown; use any of {', '.join(OPERATIONS)}")
    required, optional = OPERATIONS[do].needs, OPERATIONS[do].may
    allowed = {"at", "do", "positions", *required, *optional}
    extra = sorted(set(item) - allowed)
    if extra:
        raise ConfigError(f"{where}: do: {do} takes no {extra[0]!r}; it takes "
                          f"{', '.join(sorted(allowed - {'at', 'do'}))}")
    missing = [key for key in required if item.get(key) is None]
    if missing:
        raise ConfigError(f"{where}: do: {do} needs {missing[0]}: {_HINTS[missing[0]]}")
    return Intervention(at=item["at"], do=do, positions=_positions(where, item.get("positions")),
                        vector=_path(where, "vector", item.get("vector")),
                        alpha=_alpha(where, item.get("alpha")),
                        heads=_heads(where, item.get("heads")),
                        source=_path(where, "from", item.get("from")))


_HINTS = {"from": "a probe file (.h5) that stores rows of the same key",
          "vector": "a .npy file of one row, or <probe file>.h5:<key>",
          "heads": "a list of head numbers, from 0, e.g. [0, 3]",
          "alpha": "a number"}


def _positions(where: str, value) -> str | tuple[int, ...]:
    if value is None:
        return "all"
    if isinstance(value, str) and value in NAMED_POSITIONS:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(p, int) and not isinstance(p, bool) for p in value):
        return tuple(value)
    raise ConfigError(f"{where}: positions={value!r} is not one; use {', '.join(NAMED_POSITIONS)} "
                      "or a list of a sample's positions, e.g. [0, -1]")


def _alpha(where: str, value) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: alpha={value!r} is not a number")
    return float(value)


def _heads(where: str, value) -> tuple[int, ...]:
    if value is None:
        return ()
    heads = [value] if isinstance(value, int) else value
    if not isinstance(heads, (list, tuple)) or not heads or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in heads):
        raise ConfigError(f"{where}: heads={value!r} is not a list of head numbers from 0, "
                          "e.g. [0, 3]")
    return tuple(sorted(set(heads)))


def _path(where: str, key: str, value) -> str | None:
    """A file named by the user, as an absolute path (a relative one is the working
    directory's); a probe file's key after a colon is kept."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}={value!r} is not a path; {key}: {_HINTS[key]}")
    path, colon, inner = value.partition(".h5:")
    if colon:
        return f"{Path(path + '.h5').expanduser().absolute()}:{inner}"
    return str(Path(value).expanduser().absolute())
