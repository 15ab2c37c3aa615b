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
    longer than file systems allow (255 bytes; overrides with long paths) is cut, and the hash
    follows it likewise.
    """
    if not overrides:
        return "default"
    name = overrides.replace("=", "-").replace(",", "+").replace("[", "").replace("]", "")
    if _READABLE.fullmatch(overrides) and len(name) <= _LONGEST_NAME:
        return name
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:8]
    plain = re.sub(r"[^A-Za-z0-9._+-]", "_", name).replace("--", "-_")[:_LONGEST_NAME]
    return plain.rstrip("-") + f"--{digest}"


# the longest readable part of a run folder's name: with "--" and the hash, 210 characters,
# all ASCII, below the 255 bytes of a file name on Linux and macOS file systems
_LONGEST_NAME = 200




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
