"""The front door stays a front door, and the docs and the code cite what they mean, not where it
was decided: README.md under 200 lines; no issue number ("issue 7") and no numbered benchmark
round ("the thirteenth round") in README.md, docs/ (docs/archive/ keeps the history as it was
written) or p2pnode/. A benchmark's figures are cited by its section of docs/BENCHMARKS.md, or
by date in docs/archive/BENCHMARKS-history.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ORDINALS = ("second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth")
CITATION = re.compile(rf"\bissue #?\d+|\b(?:{ORDINALS})\s+rounds?\b", re.IGNORECASE)


def cited(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CITATION.search(line):
                name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                hits.append(f"{name}:{n}: {line.strip()[:100]}")
    return hits


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the detail into docs/"


def test_docs_and_code_cite_no_issue_or_round() -> None:
    paths = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "p2pnode").rglob("*.py"))]
    assert not cited(paths)


def test_the_check_finds_a_citation(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("Measured in the Sixteenth round, as issue 7 asked.\nA round of 24 steps; issues 3.\n")
    assert [hit.split(": ", 1)[0] for hit in cited([doc])] == ["doc.md:1"]
