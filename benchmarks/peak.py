"""The peak resident memory of a piece of Python code, run in a fresh process of its own."""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["peak_rss_mib"]


def peak_rss_mib(code: str) -> float:
    """MiB of peak resident memory (VmHWM) of a fresh ``python -c code``, progress bars off.

    VmHWM, not ru_maxrss: on Linux ru_maxrss carries over from the parent through fork and
    exec, so a child of a benchmark (by then a large process) would report the parent's peak.
    """
    code += "\nprint(int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={**os.environ, "TQDM_DISABLE": "1"})
    return int(result.stdout.split()[-1]) / 1024
