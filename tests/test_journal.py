"""The training journal (STATE_DIR/history.jsonl): a real node appends JSON lines at the
configured interval and a last one when it stops, the file is bounded by rotation, and a torn
last line is skipped by the reader."""

from __future__ import annotations

import json
from pathlib import Path

from nodes import STUB, wait_for

from p2pnode.daemon.journal import JOURNAL_NAME, Journal, read


def test_a_node_writes_its_journal_and_a_last_line_on_stop(cluster) -> None:
    a = cluster("a", extra=[*STUB, "--set", "logging.history_interval=0.2"])
    node_id = a.wait_ready()["node_id"]
    wait_for(lambda: len(read(a.state_dir)) >= 3, 20, "three journal lines")
    assert a.stop() == 0
    lines = read(a.state_dir)
    assert all(line["node"] == node_id for line in lines)
    steps = [line["step"] for line in lines]
    assert steps == sorted(steps) and steps[-1] > 0
    last = lines[-1]
    assert last["samples"] > 0 and isinstance(last["ts"], float)
    assert max(line["members_alive"] for line in lines) == 1  # the last line is written after leaving
    text = (a.state_dir / JOURNAL_NAME).read_text()
    assert "NaN" not in text and all(json.loads(x) for x in text.splitlines())


def test_rotation_bounds_the_journal_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    j = Journal(tmp_path, max_bytes=4096)
    for i in range(500):
        j.append({"step": i, "pad": "x" * 40})
    current, rotated = tmp_path / JOURNAL_NAME, tmp_path / (JOURNAL_NAME + ".1")
    assert current.stat().st_size <= 4096 and rotated.stat().st_size <= 4096
    with open(current, "ab") as fh:
        fh.write(b'{"step": 500, "pa')  # power lost mid-line
    steps = [line["step"] for line in read(tmp_path)]
    assert steps == list(range(steps[0], 500)) and len(steps) > 50
