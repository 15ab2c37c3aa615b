"""The shape of the house: the library never imports the commands layer, each default has one
home, and the file format's names are declared once."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from probe.config import NEUTRAL_KEYS
from tests.conftest import REPO

PACKAGE = REPO / "probe"
COMMANDS = PACKAGE / "commands"


def _is_command(path: Path) -> bool:
    return COMMANDS in path.parents or path.name == "__main__.py"


LIBRARY = sorted(p for p in PACKAGE.rglob("*.py") if not _is_command(p))


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _imports(path: Path, top_level: bool = False) -> set[str]:
    """Every module a file imports, at its top or inside a function (or, with ``top_level``,
    when it is imported)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in (tree.body if top_level else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("path", LIBRARY, ids=_module)
def test_the_library_never_imports_the_commands(path):
    upward = {name for name in _imports(path)
              if name.startswith("probe.commands") or name.endswith("__main__")}
    assert not upward, f"{_module(path)} imports {sorted(upward)}"


def test_importing_the_library_loads_no_command_and_no_entry_point():
    modules = [_module(p) for p in LIBRARY]
    code = (f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    assert set(modules) <= set(loaded)
    commands = [m for m in loaded if m.startswith("probe.") and
                (m.startswith("probe.commands") or m.endswith("__main__"))]
    assert not commands


def test_the_run_folder_leaves_out_exactly_the_keys_a_resume_ignores():
    conf = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())
    excluded = conf["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    assert sorted(excluded) == sorted(NEUTRAL_KEYS)


@pytest.mark.parametrize("config, schema", [("config", "probe.config:ProbeConfig"),
                                            ("fit", "probe.fit_config:FitConfig"),
                                            ("gradcam", "probe.gradcam_config:GradcamConfig")])
def test_defaults_live_in_the_schema_only(config, schema):
    fields = {f.name for f in dataclasses.fields(_load(schema))}
    conf = yaml.safe_load((REPO / "conf" / f"{config}.yaml").read_text())
    repeated = fields & set(conf) - {"model", "dataset"}  # groups are picked in the YAML
    assert not repeated, f"conf/{config}.yaml repeats the schema's defaults of {repeated}"


@pytest.mark.parametrize("function, schema", [
    ("probe.fit:fit_probes", "probe.fit_config:FitConfig"),
    ("probe.gradcam:write_gradcam", "probe.gradcam_config:GradcamConfig"),
    ("probe.gradcam:save_montage", "probe.gradcam_config:GradcamConfig"),
])
def test_python_defaults_are_the_commands_defaults(function, schema):
    defaults = {f.name: f.default for f in dataclasses.fields(_load(schema))}
    signature = inspect.signature(_load(function))
    shared = [p for p in signature.parameters.values() if p.name in defaults
              and p.default is not inspect.Parameter.empty]
    assert shared and all(p.default == defaults[p.name] for p in shared)


def test_the_import_graph_has_no_cycles():
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path, top_level=True) if m in modules and m != name}
             for name, path in modules.items()}

    def cycle_from(start, seen=()):
        for nxt in graph[start]:
            if nxt in seen:
                return [*seen[seen.index(nxt):], nxt]
            found = cycle_from(nxt, (*seen, nxt))
            if found:
                return found
        return None

    cycles = [c for c in (cycle_from(m, (m,)) for m in sorted(graph)) if c]
    assert not cycles, " -> ".join(cycles[0])


@pytest.mark.parametrize("module, allowed", [
    ("store", {"probe.errors", "probe.format", "probe.partial", "probe.version"}),
    ("format", {"probe.errors"}),
    ("partial", set()),
])
def test_the_store_and_the_file_format_import_nothing_above_them(module, allowed):
    found = _imports(PACKAGE / f"{module}.py", top_level=True)
    imported = {m.rsplit(".", 1)[0] if m.rsplit(".", 1)[0] in allowed else m
                for m in found if m.startswith("probe")}
    assert imported <= allowed, imported - allowed
