"""The experiment report (scripts/experiment_report.py) from a small recorded log of
scripts/experiment.py (tests/data/experiment_small.jsonl: the default plan, all three
conditions, 1 500 samples per worker, every other poll kept): every table and figure is built,
the paper's figures stand beside ours, what each run capped is printed (the server-only
condition with its stand-in runs named), the goals are judged from the log's numbers. No training."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "tests" / "data" / "experiment_small.jsonl"


def _module() -> Any:  # the script, loaded as a module
    spec = importlib.util.spec_from_file_location("experiment_report", ROOT / "scripts" / "experiment_report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_report_builds_every_table_and_figure_from_the_log(tmp_path: Path) -> None:
    rep = _module()
    out, figs = tmp_path / "EXPERIMENTS.md", tmp_path / "figs"
    text = rep.report(LOG, out, figs, "CMD-THAT-MADE-IT")
    assert out.read_text() == text
    recs = [json.loads(line) for line in LOG.read_text().splitlines()]
    results = [r for r in recs if r["kind"] == "result"]
    conds = list(dict.fromkeys(r["cond"] for r in results))

    # the paper's tables, beside ours
    for heading in ("### Table I", "Tables II-III", "### Time to 85 % and 88 %", "## Goals of issue 11"):
        assert heading in text
    for paper in ("0.58-0.73 s", "0.62-3.43 s", "0.3670", "0.4877", "96.7 %", "86.7 %", "79.5 %", "83.8 %"):
        assert paper in text
    # every run's final test accuracy (a parameter server's: its server's) and settings are printed
    for r in results:
        judged = [n for n in r["nodes"] if n.get("role") == "server"] or r["nodes"]
        cells = ", ".join(f"{100 * n['test_acc']:.1f} %" for n in judged)
        assert f"| {rep.NAMES[r['system']]} |" in text and cells in text, (r["run"], cells)
        assert r["settings"] in text
    # Table I's median is the log's: seconds over batches between consecutive polls, per worker
    single = next(r for r in results if r["system"] == "single")
    pts = [s for s in recs if s["kind"] == "sample" and s["run"] == single["run"]]
    per = [(b["t"] - a["t"]) / (b["step"] - a["step"]) for a, b in pairwise(pts) if b["step"] > a["step"]
           for _ in range(b["step"] - a["step"])]
    assert f"| {rep.NAMES['single']} | {min(per):.3f} | {statistics.median(per):.3f} |" in text

    # what each run capped, per condition; a condition that caps nothing of a system (300mbit: only
    # the server's link) shows that system's run of the condition that stands in for it, named so
    conditions = {r["cond"]: r for r in recs if r["kind"] == "condition"}
    assert conditions["300mbit"]["scope"] == "server" and conditions["ratio"]["scope"] == "every"
    for r in results:
        capped = "nothing (no network; one run stands for every condition)" if r["system"] == "single" else r["capped"]
        assert f"| {r['cond']} | {rep.NAMES[r['system']]} | {capped} |" in text, r["run"]
    for system, other in conditions["300mbit"]["borrowed"].items():
        assert f"| 300mbit | {rep.NAMES[system]} | nothing: no server" in text
        assert f"| {rep.NAMES[system]} (its {other} run) |" in text
    # each run's load at its start and end, and the whole command's wall time, are printed
    for r in results:
        assert f"| {r['load']['start'][0]:.1f} / {r['load']['end'][0]:.1f} |" in text, r["run"]
    end = next(r for r in recs if r["kind"] == "end")
    assert f"ran {end['runs']} runs in {end['wall'] / 60:.1f} minutes" in text

    # the goals: with only the server's link capped, the paper's ordering against each parameter
    # server, with the medians of the log (the decentralised side: the stand-in loopback run)
    def median_batch(run: str) -> float:
        roles = {n["node"]: n.get("role", "worker") for n in next(r for r in results if r["run"] == run)["nodes"]}
        per: list[float] = []
        for node in {s["node"] for s in recs if s["kind"] == "sample" and s["run"] == run}:
            if roles.get(node) != "worker":
                continue
            pts = [s for s in recs if s["kind"] == "sample" and s["run"] == run and s["node"] == node]
            per += [(b["t"] - a["t"]) / (b["step"] - a["step"]) for a, b in pairwise(pts) if b["step"] > a["step"]
                    for _ in range(b["step"] - a["step"])]
        return statistics.median(per)

    goals = text[text.index("## Goals of issue 11"):text.index("## Figures")]
    for server in ("ps", "ps-m09"):
        line = next(ln for ln in goals.splitlines() if ln.startswith("- 300mbit (only the server's link capped")
                    and f"against the {rep.NAMES[server]}:" in ln)
        a, b = median_batch("loopback/p2p-defaults"), median_batch(f"300mbit/{server}")
        assert f"median batch {a:.3f} s against {b:.3f} s" in line, line
        assert "(its loopback run)" in line and ("**holds" if a < b else "**does not hold") in line
    assert "- ratio (every link capped):" in goals and "3x sooner" in goals

    # three figures a condition, real PNGs, each shown with the command that made it under it
    pngs = sorted(figs.glob("*.png"))
    assert len(pngs) == 3 * len(conds)
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        link = f"]({png.relative_to(tmp_path)})"
        assert link in text
        assert "CMD-THAT-MADE-IT" in text[text.index(link):text.index(link) + 400]


def test_report_refuses_nothing_silently_on_a_log_without_results(tmp_path: Path) -> None:
    """A log with samples but no result records (a run cut short) still gives its tables, with
    '-' where the final figures would be, rather than a crash."""
    rep = _module()
    log = tmp_path / "cut.jsonl"
    log.write_text("\n".join(line for line in LOG.read_text().splitlines() if '"kind": "result"' not in line) + "\n")
    text = rep.report(log, tmp_path / "out.md", tmp_path / "f", "CMD")
    assert "### Table I" in text and "| - | - |" in text


def test_a_notes_file_becomes_the_reading_section(tmp_path: Path) -> None:
    """A person's reading of the numbers (LOG.notes.md beside the log) is printed as its own
    section before the figures; without one the page has no such section."""
    rep = _module()
    notes = tmp_path / "notes.md"
    notes.write_text("The goals held at the ratio cap; the server diverged.\n")
    text = rep.report(LOG, tmp_path / "a.md", tmp_path / "f", "CMD", notes)
    assert "## Reading\n\nThe goals held at the ratio cap; the server diverged.\n" in text
    assert text.index("## Goals of issue 11") < text.index("## Reading") < text.index("## Figures")
    assert "## Reading" not in rep.report(LOG, tmp_path / "b.md", tmp_path / "f", "CMD", tmp_path / "none.md")
