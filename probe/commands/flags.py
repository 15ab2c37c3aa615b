"""What the command line may hold before Hydra reads it: no flag Hydra does not know, and a
working folder that Hydra can write its run folders in. Each refusal is one line and status 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["refuse_unknown_flags", "refuse_a_read_only_directory"]

# Hydra's own command-line flags (python -m probe --help lists them)
_HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p",
                "--package", "-r", "--run", "-m", "--multirun", "-sc", "--shell-completion",
                "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                "--experimental-rerun", "-i", "--info"}


def refuse_unknown_flags(args: list[str], prog: str) -> None:
    # argparse would print Hydra's whole usage, then blame "__main__.py"
    for arg in args:
        flag = arg.split("=", 1)[0]
        if arg.startswith("-") and flag not in _HYDRA_FLAGS:
            print(f"probe: error: {prog} does not know the flag {arg!r}; settings are given as "
                  f"key=value (e.g. model=resnet18 'layers=[layer4]'), and {prog} --help "
                  "lists them", file=sys.stderr)
            sys.exit(1)


def refuse_a_read_only_directory(args: list[str]) -> None:
    # Hydra keeps every run's config and log under outputs/ here; in a folder that cannot be
    # written it would fail with a traceback before probe could say anything
    if any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=", "--help", "-h", "--cfg", "-c",
                         "--info", "--hydra-help")) for a in args):
        return
    if not os.access(Path.cwd(), os.W_OK | os.X_OK):
        print(f"probe: error: the current folder {str(Path.cwd())!r} is not writable, and each "
              "run keeps its config and log in outputs/ under it; run from a writable folder, "
              "or set hydra.run.dir=/a/writable/folder", file=sys.stderr)
        sys.exit(1)
