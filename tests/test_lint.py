"""Static check: pyflakes-class errors (undefined names, unused imports) fail the suite.

A worker that dies on a NameError only shows up when a code path runs; this catches it first.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_pyflakes_errors() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    proc = subprocess.run([ruff, "check", "--select", "F", "--no-cache", "p2pnode", "benchlib", "scripts", "tests"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
