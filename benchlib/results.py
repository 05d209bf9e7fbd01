"""Results: Markdown tables, JSON-lines records, the run's circumstances, and (only when asked
with ``--write``) a section of docs/BENCHMARKS.md replaced.

A benchmark prints its table and, with ``--jsonl FILE``, appends one JSON object per
measurement; it touches the docs only with ``--write``, so a trial run never rewrites them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib.procs import cpu_model

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "BENCHMARKS.md"


def add_output_args(ap: argparse.ArgumentParser, section: str) -> None:
    """``--write`` (replace ``section`` of docs/BENCHMARKS.md) and ``--jsonl FILE``."""
    ap.add_argument("--write", action="store_true", help=f"replace the {section!r} section of docs/BENCHMARKS.md")
    ap.add_argument("--jsonl", metavar="FILE", help="append every result to FILE as one JSON object a line")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter a column, ``l`` or ``r`` (default: first
    column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def append_jsonl(path: str | Path | None, record: dict[str, Any]) -> None:
    """Append one record (with the time it was written) as a JSON line; no-op without a path."""
    if not path:
        return
    with open(path, "a") as fh:
        fh.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}, default=str)
                 + "\n")


def command_line() -> str:
    """How this script was run, as a reader would type it."""
    script = Path(sys.argv[0])
    shown = script.relative_to(ROOT) if script.is_absolute() and script.is_relative_to(ROOT) else script
    return " ".join([".venv/bin/python", str(shown), *sys.argv[1:]])


def machine() -> str:
    """Date, CPUs, CPU model, load and Python: one line for a results section."""
    return (f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} CPUs "
            f"({cpu_model()}), load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}")


def write_section(text: str, doc: Path = DOC) -> None:
    """Replace the section of ``doc`` that starts with ``text``'s first line (a ``## `` heading),
    up to the next ``## ``; append it when there is none. Written atomically."""
    heading = text.splitlines()[0].rstrip()
    if not heading.startswith("## "):
        raise ValueError(f"a section starts with a '## ' heading, not {heading!r}")
    lines = (doc.read_text() if doc.exists() else "# Benchmarks\n").splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    body = text.rstrip("\n").splitlines()
    if start is None:
        new = lines + [""] + body
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = lines[:start] + body + ([""] if end < len(lines) else []) + lines[end:]
    tmp = doc.with_name(f".{doc.name}.tmp")
    tmp.write_text("\n".join(new) + "\n")
    os.replace(tmp, doc)
