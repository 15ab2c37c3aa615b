"""Every architecture of tests/tiny_archs.py through probe.verify (probe.pipeline.verify): the
rows of every block, the attention patterns, greedy answers and gradients, each against the
model computed sample by sample without padding, and the per-run checks of the standard names.
No check may find a wrong value; one that probe cannot make is refused in one line.

The default suite checks a few architectures of different kinds; ``pytest -m docs`` checks them
all and holds docs/models/architectures.md's table equal to what they gave
(``PROBE_WRITE_TABLE=1`` writes it)."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO

transformers = pytest.importorskip("transformers")

from probe.errors import ConfigError  # noqa: E402
from probe.pipeline.verify import CHECKS, Verdict, verify_model  # noqa: E402  (after the skip)
from tests.tiny_archs import ARCHITECTURES, tiny_checkpoint  # noqa: E402

PAGE = REPO / "docs" / "models" / "architectures.md"
# one of each kind: a decoder whose attention computes its own weights, an encoder, an
# encoder-decoder (Llama and GPT-2 run in tests/test_names.py; every one under -m docs)
SAMPLED = ("bloom", "bert", "t5")
_START, _END = "<!-- architectures: start -->", "<!-- architectures: end -->"


def _verdicts(name: str, tmp_path):
    folder = tiny_checkpoint(name, tmp_path / name)
    try:
        return verify_model(["model=transformers", f"model.name={folder}"], tmp_path / "runs")
    except ConfigError as err:  # a model that reads no text (Whisper)
        return dict.fromkeys(CHECKS, Verdict("refused", str(err)))


@pytest.mark.parametrize("name", SAMPLED)
def test_no_check_finds_a_wrong_value(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    verdicts = _verdicts(name, tmp_path)
    wrong = {check: str(v) for check, v in verdicts.items() if v.outcome == "wrong"}
    assert not wrong, wrong
    assert verdicts["forward"].outcome == "pass", verdicts["forward"]
    for verdict in verdicts.values():
        assert "\n" not in verdict.detail


def table(rows: dict[str, dict]) -> str:
    """The page's table: a row per architecture, a column per check (its outcome; a refusal's
    one line in a numbered note below the table), then the notes."""
    lines = ["| architecture | kind | " + " | ".join(CHECKS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in CHECKS) + " |"]
    notes: list[str] = []
    for name, verdicts in rows.items():
        cells = [_cell(verdicts[check], notes) for check in CHECKS]
        lines.append(f"| {name} | {ARCHITECTURES[name].kind} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.extend(f"{n}. {note}" for n, note in enumerate(notes, 1))
    return "\n".join(lines)


def _cell(verdict, notes: list[str]) -> str:
    if verdict.outcome in ("pass", "wrong"):
        return verdict.outcome
    reason = re.sub(r"\s+", " ", verdict.detail).replace("|", "/")
    if verdict.outcome == "n/a":
        return f"n/a: {reason}"
    if reason not in notes:
        notes.append(reason)
    return f"refused ({notes.index(reason) + 1})"


@pytest.mark.docs
def test_the_architecture_table_is_what_the_checks_give(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = {name: _verdicts(name, tmp_path / name) for name in ARCHITECTURES}
    made = table(rows)
    assert "| wrong" not in made, made
    text = PAGE.read_text()
    start, end = text.index(_START) + len(_START), text.index(_END)
    if os.environ.get("PROBE_WRITE_TABLE") == "1":
        PAGE.write_text(text[:start] + "\n" + made + "\n" + text[end:])
    assert text[start:end].strip() == made, "run with PROBE_WRITE_TABLE=1 to write the table"
