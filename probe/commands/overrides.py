"""Hydra's refusals of the command line in one line, as probe's own are: the override, what is
wrong with it, and what to write instead (Hydra prints several lines and a note on
HYDRA_FULL_ERROR).

    with hydra_refusals(sys.argv[1:]):
        main()          # a composition error prints "probe: error: ..." and exits 1
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hydra_refusals", "one_line"]


@contextmanager
def hydra_refusals(args: list[str]) -> Iterator[None]:
    """For the block, Hydra raises what it would print (HYDRA_FULL_ERROR), and an override
    or composition it refuses is said in one line, with status 1."""
    from hydra.errors import HydraException

    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    except HydraException as err:
        print(f"probe: error: {one_line(err, args)}", file=sys.stderr)
        sys.exit(1)
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def one_line(err: Exception, args: list[str]) -> str:
    """Hydra's refusal ``err`` of the command line ``args`` as one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    cause = [line.strip() for line in str(err.__cause__ or "").splitlines() if line.strip()]
    first = lines[0] if lines else type(err).__name__
    if first.startswith("Error merging override "):  # the override, then what is wrong
        override = first.removeprefix("Error merging override ")
        said = f"{override}: {cause[0] if cause else ''}".rstrip(": .")
        if "is not a ListConfig" in said:
            key, _, value = override.partition("=")
            said += f"; write it as a list: '{key}=[{value}]'"
        return said
    if first.startswith("Could not override"):  # a key the config does not have
        added = next((line for line in lines if line.startswith("To append")), "")
        return f"{first.rstrip('.')}: {cause[0] if cause else ''}; {added.lower()}".rstrip("; ")
    heading = next((n for n, line in enumerate(lines) if line.startswith("Available options")),
                   None)
    if heading is not None:  # a group option that does not exist: the options, on one line
        options = [line for line in lines[heading + 1:]
                   if not line.startswith(("Config search path", "provider="))]
        where = re.sub(r"^In '[^']*': ", "", first)
        return f"{where}; {lines[heading].rstrip(':').lower()}: {', '.join(options)}"
    bad = next((arg for arg in args if _unreadable(arg)), None)  # the grammar's refusal
    if bad is not None:
        link = re.search(r"https?://\S+", str(err))
        return f"cannot read the override {bad!r} ({first})" + (
            f"; see {link.group(0)}" if link else "")
    return "; ".join(lines[:2])


def _unreadable(arg: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if arg.startswith("-"):
        return False
    try:
        OverridesParser.create().parse_overrides([arg])
    except Exception:  # noqa: BLE001  (the grammar's own errors, whatever their class)
        return True
    return False
