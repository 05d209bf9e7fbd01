"""The learning-quality suite's harness end to end at a tiny size: scripts/bench_tasks.py trains
the regression task's all-reduce reference and a node alone in-process, then a real 2-node
cluster (``p2pnode start`` processes on loopback, with a cluster secret), evaluates every node's checkpoint and prints
its tables; ``--report`` rebuilds them from the JSON-lines record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchlib.status import free_port
from benchlib.tasks.suite import TASKS

ROOT = Path(__file__).resolve().parents[1]


def test_suite_goals_follow_the_metric() -> None:
    lm, cnn, reg = TASKS["charlm"], TASKS["cnn"], TASKS["regression"]
    assert lm.gain(10.0, 12.0) == 2.0 and reg.gain(0.8, 0.85) < 0  # perplexity: lower is better
    assert abs(lm.allowed(11.0) - 0.2) < 1e-9 and abs(reg.allowed(0.85) - 0.003) < 1e-9
    assert cnn.allowed(0.9) == 0.005 and lm.worst([9.0, 11.0]) == 11.0 and cnn.worst([0.8, 0.9]) == 0.8


@pytest.mark.slow  # real daemons train: 20-50 s on the shared 2-core machine
def test_bench_tasks_runs_one_tiny_task(tmp_path: Path) -> None:
    out = tmp_path / "records.jsonl"
    secret = tmp_path / "secret"  # a trusted cluster: the nodes' status asks for the credential
    secret.write_text("a cluster secret for the suite's test\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "scripts/bench_tasks.py", "--tasks", "regression", "--seeds", "0", "--nodes", "2",
           "--samples", "640", "--workdir", str(tmp_path / "runs"), "--port", str(free_port()), "--jsonl", str(out),
           "--secret", str(secret)]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["task"] == "regression" and rec["shards"] == "even" and rec["samples"] == 640 and rec["secret"]
    assert 0 < rec["cluster_s"] < 120  # the status was read (with the secret's token) as training ended
    assert len(rec["nodes_values"]) == 2 and all(-1.0 < v < 1.0 for v in rec["nodes_values"])
    assert -1.0 < rec["reference"] < 1.0 and -1.0 < rec["alone"] < 1.0
    assert "| regression | even | defaults | 0 |" in proc.stdout
    again = subprocess.run([sys.executable, "scripts/bench_tasks.py", "--report", str(out)], check=False, cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = [line for line in again.stdout.splitlines() if line.startswith("| regression | even | defaults | r2 | 1 |")]
    assert len(summary) == 1, again.stdout
