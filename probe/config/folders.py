"""The names of run folders: one per distinct command, typed back unquoted, and the sets of
shard jobs in a sweep folder that belong to one run.

``run_folder_name`` is the resolver ``probe_run_folder`` that conf/config.yaml names its run
folders with (registered when this module is imported).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import yaml
from omegaconf import OmegaConf

__all__ = ["run_folder_name", "shard_groups"]


# Characters a run folder's name keeps as they are: none of them is syntax to a shell or to
# Hydra's override parser, so the path can be typed back unquoted.
_PLAIN = r"[A-Za-z0-9._]+"
# Overrides that the readable name can be decoded back into: Hydra joins them as k=v,k=v; a
# value is plain, or a bracketed list under the keys whose schema type is a list (so `[x]`
# and `x` never both compose for one key, and dropping the brackets loses nothing).
_ITEM = rf"(?:(?:layers|hooks)=\[(?:{_PLAIN}(?:,{_PLAIN})*)?\]|{_PLAIN}={_PLAIN})"
_READABLE = re.compile(rf"{_ITEM}(?:,{_ITEM})*")


def run_folder_name(overrides: str) -> str:
    """A folder name for a run from Hydra's ``override_dirname``, one-to-one and made of
    characters that neither a shell nor Hydra treat as syntax:
    ``layers=[features.28],model=vgg16`` -> ``layers-features.28+model-vgg16``.

    ``=`` becomes ``-``, ``,`` becomes ``+`` and the brackets of ``layers`` and ``hooks`` go;
    this can be undone as long as the overrides hold only letters, digits, ``.`` and ``_``
    (no readable name holds ``--``). Otherwise the other characters
    become ``_`` and ``--`` plus 8 hex digits of the overrides' hash follow, so that two
    commands never share a folder (``layers=[a.1?]`` and ``layers=[a.1*]`` differ). A name
    longer than file systems allow (255 bytes; overrides with long paths) is cut, its longest
    overrides first, so that those that tell a sweep's jobs apart stay, and the hash follows
    it likewise.
    """
    if not overrides:
        return "default"
    name = _plain_part(overrides)
    if _READABLE.fullmatch(overrides) and len(name) <= _LONGEST_NAME:
        return name
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:8]
    parts = [re.sub(r"[^A-Za-z0-9._+-]", "_", _plain_part(part)).replace("--", "-_")
             for part in _top_level(overrides)]
    return _cut(parts).rstrip("-") + f"--{digest}"


def _plain_part(override: str) -> str:
    return override.replace("=", "-").replace(",", "+").replace("[", "").replace("]", "")


def _top_level(overrides: str) -> list[str]:
    """The overrides of Hydra's ``k=v,k=v``: split at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for n, char in enumerate(overrides):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(overrides[start:n])
            start = n + 1
    return [*parts, overrides[start:]]


def _cut(parts: list[str]) -> str:
    """The parts joined by ``+`` within _LONGEST_NAME characters: the longest part is cut
    first (a long path), so the short overrides that tell jobs apart (shard.index-3) stay."""
    parts = list(parts)
    while len("+".join(parts)) > _LONGEST_NAME:
        longest = max(range(len(parts)), key=lambda n: len(parts[n]))
        if len(parts[longest]) <= _SHORTEST_CUT:
            break
        excess = len("+".join(parts)) - _LONGEST_NAME
        parts[longest] = parts[longest][:max(_SHORTEST_CUT, len(parts[longest]) - excess)]
    return "+".join(parts)[:_LONGEST_NAME]


# the longest readable part of a run folder's name: with "--" and the hash, 210 characters,
# all ASCII, below the 255 bytes of a file name on Linux and macOS file systems
_LONGEST_NAME = 200
_SHORTEST_CUT = 24  # a cut override keeps its key and the start of its value




def shard_groups(sweep_dir: Path, exclude: list[str]) -> dict[str, list[Path]]:
    """The finished shard files of each run in a sweep folder, by the jobs' folder name without
    ``shard.index`` (``exclude``: the keys that Hydra leaves out of folder names)."""
    groups: dict[str, list[Path]] = {}
    for shard in sorted(sweep_dir.glob("*/features.h5")):
        name = _name_without_shard_index(shard.parent, exclude)
        if name is not None:
            groups.setdefault(name, []).append(shard)
    return groups


def _name_without_shard_index(job_dir: Path, exclude: list[str]) -> str | None:
    # the job's run folder name as Hydra makes it (its override_dirname: the overrides but the
    # excluded keys, sorted, joined by commas), without shard.index; None for a job that is
    # not one shard of several
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    if not overrides_file.is_file():
        return None
    parsed = OverridesParser.create().parse_overrides(
        [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []])
    if not {"shard.index", "shard.count"} <= {o.key_or_group for o in parsed}:
        return None
    kept = sorted(o.input_line for o in parsed
                  if o.key_or_group not in (*exclude, "shard.index"))
    return run_folder_name(",".join(kept))


OmegaConf.register_new_resolver("probe_run_folder", run_folder_name, replace=True)
