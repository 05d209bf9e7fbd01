"""Static check: mypy over p2pnode/ with the settings of pyproject.toml ([tool.mypy]).

A wrong type on a path no test runs (a refusal branch, a rare message) would otherwise only
show up in production; the checker reads every path.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_mypy_finds_no_type_errors() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
