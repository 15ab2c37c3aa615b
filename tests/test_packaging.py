"""The wheel ships every module and the configs: an installed (non-editable) probe runs from any
directory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO


def test_every_package_is_listed_for_the_wheel():
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is not in Python 3.10)
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"\npackages = \[(.*?)\]", text,
                                                        re.S).group(1)))
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "probe").rglob(
        "__init__.py")}
    assert found | {"probe.conf"} == listed


@pytest.mark.slow
def test_wheel_carries_everything_and_runs_from_elsewhere(tmp_path):
    # built from a copy, so that no build/ folder is left in (or taken from) the checkout
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "outputs", "*.egg-info", "__pycache__", "docs"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("probe-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "probe").rglob("*.py")}
    assert modules <= names
    assert {"probe/conf/config.yaml", "probe/conf/model/vgg16.yaml",
            "probe/conf/dataset/synthetic.yaml"} <= names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-m", "probe", "model=resnet18", "layers=[fc]",
         "dataset.image_size=32", "dataset.num_samples=2", f"output.path={tmp_path}/f.h5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "f.h5").is_file()
    merged = subprocess.run([sys.executable, "-m", "probe.merge", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True)
    assert merged.returncode == 0 and "shard" in merged.stdout
    where = subprocess.run([sys.executable, "-c", "import probe.config as c; print(c.CONFIG_DIR)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.stdout.strip() == str(site / "probe" / "conf")
