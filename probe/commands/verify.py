"""``python -m probe.verify model=... [model.name=...]``: one checkpoint checked four ways
(probe.pipeline.verify), printed as a table. Writes nothing where it runs; exits 1 where a
check finds a wrong row. Its arguments are the run's overrides (it composes several runs of
its own, so it is no Hydra app itself)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from probe.commands import exit_on_user_error
from probe.commands.overrides import hydra_refusals
from probe.errors import ProbeError

__all__ = ["main"]

_PROG = "python -m probe.verify"


@exit_on_user_error
def _verify(overrides: list[str]) -> None:
    from probe.pipeline.verify import verify_model

    with tempfile.TemporaryDirectory(prefix="probe-verify-") as folder:
        verdicts = verify_model(overrides, Path(folder))
    width = max(len(check) for check in verdicts)
    print(f"{'check'.ljust(width)}  outcome  detail")
    for check, verdict in verdicts.items():
        print(f"{check.ljust(width)}  {verdict.outcome.ljust(7)}  {verdict.detail}")
    wrong = [check for check, verdict in verdicts.items() if verdict.outcome == "wrong"]
    if wrong:
        raise ProbeError(f"{', '.join(wrong)}: probe's values are not the model's here; please "
                         "report it with this table")


def main() -> None:
    """``python -m probe.verify``: the checks of one checkpoint; writes no run folder."""
    args = sys.argv[1:]
    if any(arg in ("-h", "--help") for arg in args):
        print(f"usage: {_PROG} model=transformers model.name=<Hub id or folder> [key=value "
              "...]\n\nRuns the checkpoint through probe on three texts of its own (every "
              "block's rows, attention patterns, greedy generation, gradients) and compares "
              "each with the model computed sample by sample; prints a table of pass, wrong, "
              "refused (probe's one line) or n/a for each check.")
        return
    flags = [arg for arg in args if arg.startswith("-")]
    if flags:
        print(f"probe: error: {_PROG} does not know the flag {flags[0]!r}; settings are given "
              "as key=value (model=transformers model.name=gpt2)", file=sys.stderr)
        sys.exit(1)
    os.environ.setdefault("TQDM_DISABLE", "1")  # the table is the output, not four bars
    with hydra_refusals(args):
        _verify(args)
