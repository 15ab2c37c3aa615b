"""The shape of the house: floors of folders that form a tree (each imports only the floors its
row of the table allows), thin entry points, no import cycle, each default in one home, and
the file format's names declared once."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
import yaml

from probe.config.schema import NEUTRAL_KEYS
from tests.conftest import REPO

PACKAGE = REPO / "probe"
_BASE = {"errors", "version"}
# Each floor and the floors it may import besides its own: a tree, not a line. The file format
# owns the names it writes (the config imports them); the run (pipeline) and the analyses
# stand side by side on the base and the model families, and neither imports the other (the
# analyses rebuild a run's dataset as its family prepares it: Grad-CAM's images); the
# commands stand on everything.
ALLOWED = {
    "errors": set(),
    "version": set(),
    "file": _BASE,
    "config": _BASE | {"file"},
    "data": _BASE | {"config", "file"},
    "families": _BASE | {"config", "file", "data"},
    "pipeline": _BASE | {"config", "file", "data", "families"},
    "analyses": _BASE | {"config", "file", "data", "families"},
    "commands": _BASE | {"config", "file", "data", "families", "pipeline", "analyses"},
}
FLOORS = list(ALLOWED)
# what python -m probe.<command> runs; each only calls into probe.commands
ENTRY_POINTS = {"__main__", "layers", "merge", "fit", "gradcam", "compare", "encode", "verify",
                "export"}
MODULES = {p: ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
           for p in sorted(PACKAGE.rglob("*.py"))}


def _floor(module: str) -> str:
    """The floor of a module of the package ("entry" for the entry points)."""
    part = module.split(".")[1] if "." in module else "__init__"
    return "entry" if part in ENTRY_POINTS else part


def _load(spec: str):
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def _imports(path: Path) -> set[str]:
    """Every module of the package that a file imports, at its top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & set(MODULES.values())


def test_the_package_shows_its_floors():
    entries = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
               if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    floors = entries - ENTRY_POINTS - {"__init__", "version"}
    assert floors <= set(FLOORS) and len(floors) <= 8, sorted(floors)
    for name in ENTRY_POINTS:
        lines = (PACKAGE / f"{name}.py").read_text().splitlines()
        assert len(lines) <= 15, name
        command = "run" if name == "__main__" else name
        assert _imports(PACKAGE / f"{name}.py") == {f"probe.commands.{command}"}


@pytest.mark.parametrize("path", list(MODULES), ids=list(MODULES.values()))
def test_a_floor_imports_only_the_floors_its_row_allows(path):
    own = _floor(MODULES[path])
    if own in ("entry", "__init__"):
        return
    refused = [m for m in _imports(path) if _floor(m) not in ("__init__", own)
               and _floor(m) not in ALLOWED[own]]
    assert not refused, f"{MODULES[path]} (floor {own}) imports {sorted(refused)}"


def test_the_run_and_the_analyses_stand_side_by_side_and_the_file_below_the_config():
    # the table says it; this says it outright, as the promise it is
    assert "pipeline" not in ALLOWED["analyses"] and "analyses" not in ALLOWED["pipeline"]
    assert "config" not in ALLOWED["file"]
    for floor, allowed in ALLOWED.items():  # a tree: no floor reaches one that reaches it
        assert all(floor not in ALLOWED[other] for other in allowed), floor


def test_the_import_graph_has_no_cycles():
    # imports inside functions count, and so does a package that imports its own submodule
    graph = {module: _imports(path) - {module} for path, module in MODULES.items()}

    def cycle_from(start, seen=()):
        for nxt in sorted(graph[start]):
            if nxt in seen:
                return [*seen[seen.index(nxt):], nxt]
            found = cycle_from(nxt, (*seen, nxt))
            if found:
                return found
        return None

    cycles = [c for c in (cycle_from(m, (m,)) for m in sorted(graph)) if c]
    assert not cycles, " -> ".join(cycles[0])


def test_the_run_folder_leaves_out_exactly_the_keys_a_resume_ignores():
    conf = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())
    excluded = conf["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"]
    assert sorted(excluded) == sorted(NEUTRAL_KEYS)


@pytest.mark.parametrize("config, schema", [
    ("config", "probe.config.schema:ProbeConfig"),
    ("fit", "probe.analyses.fit.config:FitConfig"),
    ("gradcam", "probe.analyses.gradcam.config:GradcamConfig"),
])
def test_defaults_live_in_the_schema_only(config, schema):
    fields = {f.name for f in dataclasses.fields(_load(schema))}
    conf = yaml.safe_load((REPO / "conf" / f"{config}.yaml").read_text())
    repeated = fields & set(conf) - {"model", "dataset"}  # groups are picked in the YAML
    assert not repeated, f"conf/{config}.yaml repeats the schema's defaults of {repeated}"


@pytest.mark.parametrize("function, schema", [
    ("probe.analyses.fit:fit_probes", "probe.analyses.fit.config:FitConfig"),
    ("probe.analyses.gradcam:write_gradcam", "probe.analyses.gradcam.config:GradcamConfig"),
    ("probe.analyses.gradcam:save_montage", "probe.analyses.gradcam.config:GradcamConfig"),
])
def test_python_defaults_are_the_commands_defaults(function, schema):
    defaults = {f.name: f.default for f in dataclasses.fields(_load(schema))}
    signature = inspect.signature(_load(function))
    shared = [p for p in signature.parameters.values() if p.name in defaults
              and p.default is not inspect.Parameter.empty]
    assert shared and all(p.default == defaults[p.name] for p in shared)


def test_no_command_file_does_library_work():
    # the torchrun launcher aside, a command parses, calls the library and prints
    for path in (PACKAGE / "commands").glob("*.py"):
        if path.name != "ranks.py":
            assert len(path.read_text().splitlines()) <= 80, path.name
        reached = {m for m in _imports(path) if m.startswith(("probe.families", "probe.data",
                                                               "probe.pipeline.keys"))
                   and m != "probe.data.selection"}  # which samples a torchrun rank takes
        assert not reached, f"{path.name} imports {sorted(reached)}"


def test_families_inherit_at_most_two_deep():
    from probe.families.base import Family

    for module in [m for m in MODULES.values() if m.startswith("probe.families.")]:
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if issubclass(cls, Family) and cls is not Family:
                assert Family in cls.__bases__, f"{cls.__qualname__} derives from {cls.__bases__}"
