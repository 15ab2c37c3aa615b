"""The contributor's map (docs/architecture.md) is the code's: its floors and what each may
import, every protocol table, the layouts, the capture kinds, the passes and the entry points
are read from the page and compared with the package."""

from __future__ import annotations

import importlib
import re
import typing

import pytest

from tests.conftest import REPO
from tests.test_structure import ALLOWED, ENTRY_POINTS

PAGE = (REPO / "docs" / "architecture.md").read_text()
_CODE = re.compile(r"`([^`]+)`")


def _table(header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the page's tables whose header row starts with
    ``header``."""
    lines, rows = PAGE.splitlines(), []
    for start in [n for n, line in enumerate(lines) if line.startswith(f"| {header} |")]:
        for line in lines[start + 2:]:
            if not line.startswith("|"):
                break
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _names(cell: str) -> list[str]:
    """The `code` names of a cell, a call's arguments left out."""
    return [name.split("(")[0] for name in _CODE.findall(cell)]


def _members(protocol) -> set[str]:
    found = getattr(typing, "get_protocol_members", None)  # Python 3.13
    return set(found(protocol) if found else typing._get_protocol_attrs(protocol))


PROTOCOLS = {"Builds": "probe.families.base", "Preprocesses": "probe.families.base",
             "FeedsAndReads": "probe.families.base", "Checks": "probe.families.base",
             "Feed": "probe.data.feed", "Pass": "probe.pipeline.passes"}


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_each_protocol_table_lists_the_protocols_members(name):
    rows = {row[0].strip("`"): _names(row[1]) for row in _table("protocol")}
    protocol = getattr(importlib.import_module(PROTOCOLS[name]), name)
    assert set(rows[name]) == _members(protocol), name


def test_the_family_protocols_together_are_the_family():
    from probe.families.base import Family

    listed = set().union(*(_names(row[1]) for row in _table("protocol")
                           if row[0].strip("`") in ("Builds", "Preprocesses", "FeedsAndReads",
                                                    "Checks")))
    assert listed == {n for n in vars(Family) if not n.startswith("_")}


def test_the_layout_tables_are_the_layouts_and_their_members():
    from probe.data import layouts

    named = {row[0].strip("`") for row in _table("layout")}
    # every layout the package offers (SampleRows' one instance, SAMPLE_ROWS, stands for it)
    classes = {name for name in layouts.__all__ if name == "SAMPLE_ROWS" or (
        isinstance(getattr(layouts, name), type) and hasattr(getattr(layouts, name), "select")
        and not getattr(getattr(layouts, name), "_is_protocol", False)
        and name != "SampleRows")}
    assert named == classes
    members = {_names(row[0])[0] for row in _table("member")}
    assert members == _members(layouts.RowLayout)


def test_the_capture_kinds_table_is_the_built_in_kinds():
    from probe.file.format import KINDS
    from probe.pipeline.kinds import capture_kinds

    rows = [(row[0].strip("`"), row[1].strip("`")) for row in _table("hook")]
    assert rows == [(kind.hook, kind.kind) for kind in capture_kinds([h for h, _ in rows])]
    assert {kind: hook for hook, kind in rows} == KINDS  # the file format's own table


def test_the_passes_table_is_the_passes():
    import probe.pipeline.generation
    import probe.pipeline.generation_decoded
    import probe.pipeline.interventions
    import probe.pipeline.passes

    modules = {"ForwardPass": probe.pipeline.passes, "GenerationPass": probe.pipeline.generation,
               "DecodedGenerationPass": probe.pipeline.generation_decoded,
               "Intervened": probe.pipeline.interventions}
    named = {row[0].strip("`") for row in _table("pass")}
    assert named == set(modules)
    for name, module in modules.items():
        assert _members(probe.pipeline.passes.Pass) <= set(dir(getattr(module, name)))


def test_the_floors_table_is_the_structure_tests_tree():
    rows = _table("floor")
    floors = {row[0].strip("`").removesuffix("/").removesuffix(".py"): row[1] for row in rows}
    assert set(floors) == set(ALLOWED) - {"version"}
    for floor, cell in floors.items():
        allowed = set(ALLOWED) - {floor} if cell == "every floor" else set(_names(cell))
        assert allowed | {"version"} == ALLOWED[floor] | {"version"}, floor
    # and every module the third column names is in its floor's folder
    for row in rows:
        folder = REPO / "probe" / row[0].strip("`")
        for module in _names(row[2]):
            if module.endswith((".py", "/")) and folder.is_dir():
                assert list(folder.rglob(module.rstrip("/"))), f"{folder}/{module}"


def test_the_entry_points_table_is_the_entry_points():
    named = {row[0].strip("`").removesuffix(".py") for row in _table("entry point")}
    assert named == ENTRY_POINTS
    for row in _table("entry point"):
        module = row[0].strip("`").removesuffix(".py")
        command = "probe" if module == "__main__" else f"probe.{module}"
        assert row[1] == f"`python -m {command}`"
