"""The command line in this process: ``cli("model=resnet18", "layers=[fc]", cwd=tmp_path)``
runs ``python -m probe ...`` as the entry point would (argv, working folder, Hydra, its logging
and run folder, the exit status, what is printed), without a fresh Python paying the torch
import. A test that checks what a command did or said uses this; one whose subject is the
process itself (a kill, a signal, torchrun, what a fresh import loads) starts a real process
(conftest.run_cli).
"""

from __future__ import annotations

import importlib
import io
import logging
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

__all__ = ["cli"]

_COMMANDS = {"probe": "run", "probe.layers": "layers", "probe.merge": "merge",
             "probe.fit": "fit", "probe.gradcam": "gradcam", "probe.compare": "compare",
             "probe.encode": "encode", "probe.export": "export",
             "probe.verify": "verify"}


def cli(*args: str, cwd: Path, module: str = "probe", **env: str
        ) -> subprocess.CompletedProcess:
    """``python -m <module> ARGS`` from ``cwd``, in this process; its status, stdout, stderr."""
    main = importlib.import_module(f"probe.commands.{_COMMANDS[module]}").main
    saved_env = {key: os.environ.get(key) for key in ("HYDRA_FULL_ERROR", *env)}
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    os.environ.update({"HYDRA_FULL_ERROR": "0", **env})
    try:
        os.chdir(cwd)
        sys.argv = [f"{module}/__main__.py", *args]
        with redirect_stdout(out), redirect_stderr(err):
            status = _status(main)
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _restore_logging(root, *saved_logging)
        _forget_hydra()
    return subprocess.CompletedProcess([module, *args], status, out.getvalue(), err.getvalue())


def _status(main) -> int:
    # what the process would exit with; an uncaught error prints its traceback, as Python does
    try:
        main()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001  (the process would die of it)
        traceback.print_exc()
        return 1
    return 0


def _restore_logging(root: logging.Logger, handlers: list, level: int) -> None:
    # Hydra configured logging for the run (its probe.log in the run folder): undone, so that
    # the file is closed and later tests log where they did before
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)
    logging.disable(logging.NOTSET)


def _forget_hydra() -> None:
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
