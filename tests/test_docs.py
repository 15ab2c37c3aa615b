"""Every command the docs show runs as shown (``python -m pytest -m docs``; CI runs it beside the
default suite).

The commands of each page's ```bash blocks run in order, in a fresh copy of the sandbox
(tests/docs_sandbox.py: the data files the docs name, and tiny stand-ins for the Hub ids they
name), offline, and each must succeed. A command that cannot run here (a SLURM sweep, torchrun
on GPUs, an install) stands in a ```console block, and must be one that ELSEWHERE names: the
test that runs it, or what does.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli

PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SHELL = re.compile(r"[|;&<>`$]")  # syntax that only a shell reads
_GLOB = re.compile(r"[*?[]")
_TOKEN = re.compile(r"""(?:[^\s'"]+|'[^']*'|"(?:\\.|[^"\\])*")+""")  # a word, quotes and all
# python -m <command> of probe's, which run in this process (tests.cli)
_IN_PROCESS = {"probe", "probe.layers", "probe.merge", "probe.fit", "probe.gradcam",
               "probe.compare", "probe.encode", "probe.export", "probe.verify"}

# ```console commands, by a part of each that names it: what runs it instead
ELSEWHERE: dict[str, str] = {
    "python3 -m venv .venv": ".ci/run (the README's two set-up commands)",
    "pip install": ".ci/run installs the extras; tests/test_packaging.py builds the wheel",
    "mkdocs": ".ci/run builds the site with mkdocs build --strict",
    "hydra/launcher=submitit_slurm": "tests/test_slurm.py (PROBE_SLURM_TESTS=1, -m slow)",
    "start_cluster.sh": "tests/test_slurm.py (.ci/run with PROBE_SLURM_TESTS=1)",
    "PROBE_SLURM_TESTS=1": "tests/test_slurm.py",
    "torchrun": "tests/test_torchrun.py",
    "srun": "tests/test_torchrun.py (its nodes) and tests/test_slurm.py",
    "gpu_check.sh": "benchmarks/gpu_check.sh, on a CUDA machine",
    "-m gpu": "tests/test_gpu.py, on a CUDA machine",
    "benchmarks/": "the benchmarks themselves (docs/performance.md)",
    "git worktree": "the benchmarks' A/B comparison (docs/performance.md)",
    "-m slow": "pytest -m slow",
    "scontrol": "tests/test_slurm.py",
    "squeue": "tests/test_slurm.py",
    "dataset.download=true": "torchvision's own download (needs the network)",
    "python -m pytest": ".ci/run",
    ".ci/run": "CI itself",
    "h5ls": "tests/test_other_readers.py",
    "h5dump": "tests/test_other_readers.py",
    "dataset.root=films": "docs/movies-and-stories.md runs it on films it makes (pytest -m docs)",
    "targets=bold.npy tr=1.49": "docs/movies-and-stories.md runs it on voxels it simulates",
}


def commands(block: str) -> list[str]:
    """The commands of a ```bash block: comment lines left out, continued lines joined, a
    heredoc kept with its body."""
    found, lines = [], block.splitlines()
    n = 0
    while n < len(lines):
        line = lines[n]
        n += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and n < len(lines):
            line = line[:-1] + " " + lines[n].strip()
            n += 1
        heredoc = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if heredoc:
            body = []
            while n < len(lines) and lines[n].strip() != heredoc.group(1):
                body.append(lines[n])
                n += 1
            n += 1
            line = "\n".join([line, *body, heredoc.group(1)])
        found.append(line)
    return found


def blocks(page: Path, kind: str) -> list[str]:
    return [body for fence, body in _FENCE.findall(page.read_text()) if fence == kind]


def _page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory):
    from tests.docs_sandbox import make_sandbox

    return make_sandbox(tmp_path_factory.mktemp("sandbox"))


@pytest.mark.docs
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_of_the_page_runs(page, sandbox, tmp_path):
    shown = [c for block in blocks(page, "bash") for c in commands(block)]
    if not shown:
        pytest.skip("no commands")
    here = tmp_path / "work"
    shutil.copytree(sandbox, here)
    for command in shown:
        done = _run(command, here)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    words = _words(command, cwd) if not _SHELL.search(command) else []
    if words[:2] == ["python", "-m"] and len(words) > 2 and words[2] in _IN_PROCESS:
        return cli(*words[3:], cwd=cwd, module=words[2])
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python: ours
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": path},
                          timeout=1800)


def _words(command: str, cwd: Path) -> list[str]:
    # as bash splits them: quotes taken off, and an unquoted glob matched against the folder
    words = []
    for token in _TOKEN.findall(command):
        if token.startswith("#"):
            break
        unquoted = not ({"'", '"'} & set(token))
        token = shlex.split(token)[0]
        matches = sorted(glob.glob(token, root_dir=cwd)) if unquoted and _GLOB.search(token) else []
        words += matches or [token]
    return words


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_that_cannot_run_here_is_run_elsewhere(page):
    for block in blocks(page, "console"):
        for command in commands(block):
            assert any(part in command for part in ELSEWHERE), (
                f"{_page_id(page)}: {command!r} runs in no test; make it run in the sandbox "
                "(a ```bash block), or name what runs it in tests/test_docs.py's ELSEWHERE")


def test_the_docs_show_commands():
    assert sum(len(commands(b)) for page in PAGES for b in blocks(page, "bash")) >= 20
