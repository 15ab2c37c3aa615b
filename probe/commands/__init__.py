"""The commands layer: Hydra entry points, argparse, printing and exit codes.

    python -m probe            probe.commands.run       the pipeline
    python -m probe.layers     probe.commands.layers    the modules of a model, with sizes
    python -m probe.merge      probe.commands.merge     join shard files (and the sweep callback)
    python -m probe.fit        probe.commands.fit       linear probes on a file
    python -m probe.gradcam    probe.commands.gradcam   Grad-CAM maps of a file
    python -m probe.compare    probe.commands.compare   CKA and RSA between stored keys
    python -m probe.encode     probe.commands.encode    ridge encoding models of stored keys
    python -m probe.export     probe.commands.export    a file in the next tool's format
    python -m probe.verify     probe.commands.verify    a checkpoint checked against itself

Everything here parses, calls the library and prints (the library never imports it); a user
error (a ProbeError, or Hydra's refusal) is one line and status 1, a stopped run's 128 + signal.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable

from probe.commands.flags import refuse_unknown_flags
from probe.commands.overrides import hydra_refusals
from probe.config import CONFIG_DIR, folders  # noqa: F401  (folders: the run folder's resolver)
from probe.errors import ProbeError, RunStopped

__all__ = ["exit_on_user_error", "hydra_command", "to_log_files"]

log = logging.getLogger("probe")


def exit_on_user_error(task: Callable) -> Callable:
    """A command whose ProbeError is one line and status 1 (a stopped run's: 128 + signal)."""

    @functools.wraps(task)
    def wrapped(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except RunStopped as stopped:
            to_log_files(logging.WARNING, str(stopped))
            print(f"probe: {stopped}", file=sys.stderr)
            sys.exit(stopped.exit_code)
        except ProbeError as err:
            to_log_files(logging.ERROR, str(err))
            print(f"probe: error: {err}", file=sys.stderr)
            sys.exit(1)
    return wrapped


def to_log_files(level: int, message: str) -> None:  # the printed line, in the run's log
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def hydra_command(config_name: str, prog: str, schema: type | None = None
                  ) -> Callable[[Callable], Callable[[], None]]:
    """``hydra.main`` on probe's config folder with ``config_name`` (its ``schema``: the run's
    unless given), for a task wrapped by ``exit_on_user_error``; ``prog`` (``python -m
    probe.layers``) names the command in the one line that refuses an unknown flag."""
    import hydra

    from probe.config.compose import register

    register(config_name, schema)
    decorate = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR),
                          config_name=config_name)

    def wrap(task: Callable) -> Callable[[], None]:
        main = decorate(task)

        def checked() -> None:
            refuse_unknown_flags(sys.argv[1:], prog)
            with hydra_refusals(sys.argv[1:]):
                main()
        return checked
    return wrap
