"""The commands layer: Hydra entry points, argparse, printing and exit codes.

    python -m probe            probe.commands.run       the pipeline
    python -m probe.layers     probe.commands.layers    the modules of a model, with sizes
    python -m probe.merge      probe.commands.merge     join shard files (and the sweep callback)
    python -m probe.fit        probe.commands.fit       linear probes on a file
    python -m probe.gradcam    probe.commands.gradcam   Grad-CAM maps of a file
    python -m probe.compare    probe.commands.compare   CKA and RSA between stored keys
    python -m probe.encode     probe.commands.encode    ridge encoding models of stored keys

Everything here calls the library below it (probe.runner, probe.merge, probe.fit, ...); nothing
in the library imports this package. A user error (a ProbeError) is printed as one line and
exits with status 1; a run stopped by a signal says so and exits with 128 + the signal.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import sys
from collections.abc import Callable

from omegaconf import OmegaConf

from probe.config import CONFIG_DIR
from probe.errors import ProbeError, RunStopped

__all__ = ["exit_on_user_error", "hydra_command", "run_folder_name"]

log = logging.getLogger("probe")


def exit_on_user_error(task: Callable) -> Callable:
    """Wrap a command so that a ProbeError prints one line and exits non-zero (1, or a stopped
    run's 128 + signal), not a traceback. The line also goes to the log (a run's probe.log)."""

    @functools.wraps(task)
    def wrapped(*args, **kwargs):
        try:
            return task(*args, **kwargs)
        except RunStopped as stopped:
            _to_log_files(logging.WARNING, str(stopped))
            print(f"probe: {stopped}", file=sys.stderr)
            sys.exit(stopped.exit_code)
        except ProbeError as err:
            _to_log_files(logging.ERROR, str(err))
            print(f"probe: error: {err}", file=sys.stderr)
            sys.exit(1)
    return wrapped


def _to_log_files(level: int, message: str) -> None:
    # the console already gets the printed line; the run's log file should have it too
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def hydra_command(config_name: str, prog: str) -> Callable[[Callable], Callable[[], None]]:
    """``hydra.main`` on probe's config folder with ``config_name``, for a task that is
    already wrapped by ``exit_on_user_error``; ``prog`` (``python -m probe.layers``) names the
    command in the one line that refuses a flag Hydra does not know."""
    import hydra

    decorate = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR),
                          config_name=config_name)

    def wrap(task: Callable) -> Callable[[], None]:
        main = decorate(task)

        def checked() -> None:
            _refuse_unknown_flags(sys.argv[1:], prog)
            main()
        return checked
    return wrap


# Hydra's own command-line flags (python -m probe --help lists them)
_HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--resolve", "-p",
                "--package", "-r", "--run", "-m", "--multirun", "-sc", "--shell-completion",
                "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                "--experimental-rerun", "-i", "--info"}


def _refuse_unknown_flags(args: list[str], prog: str) -> None:
    # argparse would print Hydra's whole usage, then blame "__main__.py"
    for arg in args:
        flag = arg.split("=", 1)[0]
        if arg.startswith("-") and flag not in _HYDRA_FLAGS:
            print(f"probe: error: {prog} does not know the flag {arg!r}; settings are given as "
                  f"key=value (e.g. model=resnet18 'layers=[layer4]'), and {prog} --help "
                  "lists them", file=sys.stderr)
            sys.exit(1)


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


OmegaConf.register_new_resolver("probe_run_folder", run_folder_name, replace=True)
