"""The wheel ships the configs: an installed (non-editable) probe runs from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_wheel_carries_conf_and_runs_from_elsewhere(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("probe-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"probe/conf/config.yaml", "probe/conf/model/vgg16.yaml",
            "probe/conf/dataset/synthetic.yaml"} <= names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-m", "probe", "model=resnet18", "layers=[fc]",
         "dataset.image_size=32", "dataset.num_samples=2", f"output.path={tmp_path}/f.h5"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "f.h5").is_file()
    where = subprocess.run([sys.executable, "-c", "import probe.config as c; print(c.CONFIG_DIR)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.stdout.strip() == str(site / "probe" / "conf")
