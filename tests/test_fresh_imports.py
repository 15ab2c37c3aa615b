"""What a fresh Python loads: the hooks and the reader need no Hydra, an image run imports no
text module, importing the library loads no command, and probe.fit without a plot never
imports matplotlib. One fresh process makes every check, in that order (each step would load
what a later one looks for), and reports to the tests below."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY_NET, compose_cfg
from tests.test_structure import MODULES, _floor

_LIBRARY = [m for m in MODULES.values() if _floor(m) not in ("commands", "entry")]

_SCRIPT = """
import importlib, json, sys
report = {}
import torch, probe
model = torch.nn.Sequential(torch.nn.Linear(2, 2))
with probe.attach(model, ['0']) as cap:
    model(torch.ones(1, 2))
report['hooks'] = [list(cap['0/output'].shape), 'hydra' in sys.modules]
with probe.open(sys.argv[1]) as f:
    f['fc/output'][:]
report['open'] = 'hydra' in sys.modules
probe.run(probe.compose(['model=custom', 'model._target_=tests.tiny.TinyNet', 'layers=[fc]',
                         'dataset.image_size=32', 'dataset.num_samples=4',
                         'output.path=' + sys.argv[2]]))
report['image_run'] = sorted(m for m in sys.modules if m.split('.')[0] in
                             ('transformers', 'datasets') or m.startswith('probe.data.text'))
for module in json.loads(sys.argv[3]):
    importlib.import_module(module)
report['library'] = sorted(m for m in sys.modules if m.startswith('probe.commands'))
report['unloaded'] = sorted(set(json.loads(sys.argv[3])) - set(sys.modules))
from probe.commands.fit import main
sys.argv = ['probe.fit', 'file=' + sys.argv[1], 'out_dir=' + sys.argv[4], 'epochs=2',
            'plot=false']
try:
    main()
except SystemExit as stop:
    report['fit_status'] = stop.code
report['fit'] = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib')
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fresh")
    features = probe_file(directory / "features.h5")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(features),
                           str(directory / "image.h5"), json.dumps(_LIBRARY),
                           str(directory / "fit")], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_file(path):
    import probe

    return probe.run(compose_cfg(*TINY_NET, "layers=[fc]", "dataset.num_samples=12",
                                 output=path))


def test_the_hooks_need_no_hydra(report):
    assert report["hooks"] == [[1, 2], False]


def test_reading_a_file_needs_no_hydra(report):
    assert report["open"] is False


def test_image_runs_do_not_import_the_text_modules(report):
    assert report["image_run"] == []


def test_importing_the_library_loads_no_command(report):
    assert report["unloaded"] == [] and report["library"] == []


def test_fit_without_a_plot_never_imports_matplotlib(report):
    assert report.get("fit_status") in (None, 0) and report["fit"] == []
