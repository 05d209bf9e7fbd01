"""scripts/experiment.py refuses, before anything is written, a plan that needs hivemind where it
is not installed: a report without its hivemind rows would silently replace the last whole one
(CI installs the test extra, not the bench extra, so hivemind is absent there)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("hivemind") is not None, reason="hivemind is installed here")
def test_a_plan_with_hivemind_is_refused_without_it_and_the_last_log_is_kept(tmp_path: Path) -> None:
    log = tmp_path / "full.jsonl"
    log.write_text('{"kind": "meta"}\n')
    proc = subprocess.run([sys.executable, "scripts/experiment.py", "--conditions", "loopback", "--workdir",
                           str(tmp_path / "work"), "--jsonl", str(log)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "hivemind is not installed" in proc.stderr and "scripts/experiment.sh" in proc.stderr, proc.stderr
    assert log.read_text() == '{"kind": "meta"}\n'  # the last run's log, untouched
    assert not list((tmp_path / "work").glob("**/*.log"))  # no system was started
