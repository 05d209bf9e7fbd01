"""Two threads writing one small state file at once both succeed, and the file is one of the
two, whole (p2pnode/checkpoint.py). Both used one temp name (the process id): one renamed the
other's temp file away, and the other's rename raised FileNotFoundError, which stopped the
daemon (found by CI: members.json saved by the member loop and by the checkpointer at once)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from p2pnode.checkpoint import write_atomic


def test_concurrent_writers_of_one_file_never_fail_and_leave_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "members.json"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(i: int) -> None:
        start.wait()
        try:
            for n in range(40):
                write_atomic(path, json.dumps({"writer": i, "n": n, "pad": "x" * 4096}).encode())
        except BaseException as exc:  # noqa: BLE001 - any failure is the test's finding
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    last = json.loads(path.read_text())
    assert 0 <= last["writer"] < 8 and last["n"] == 39
    assert [p.name for p in tmp_path.iterdir()] == ["members.json"]
