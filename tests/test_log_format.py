"""``logging.format = "json"``: every line a real node writes to stderr, the daemon's and its
worker's, is one JSON object with the same keys (p2pnode/logfmt.py), and the node id appears
once it is known. The default stays text."""

from __future__ import annotations

import json

from nodes import STUB

from p2pnode.logfmt import SCHEMA


def test_json_logs_from_both_processes(cluster) -> None:
    a = cluster("a", extra=[*STUB, "--set", "logging.format=json"])
    node_id = a.wait_ready()["node_id"]
    assert a.stop() == 0
    lines = [line for line in a.log().splitlines() if line.strip()]
    docs = []
    for line in lines:
        doc = json.loads(line)  # every line, or this raises
        assert tuple(doc)[:len(SCHEMA)] == SCHEMA, doc
        assert doc["level"] in ("debug", "info", "warning", "error", "critical")
        docs.append(doc)
    assert {d["process"] for d in docs} == {"daemon", "worker"}
    assert any(d["process"] == "worker" and d["node"] == node_id for d in docs)
    assert any(d["process"] == "daemon" and d["node"] == node_id and "stopped cleanly" in d["msg"] for d in docs)
    assert len({d["pid"] for d in docs}) == 2


def test_text_is_the_default(cluster) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    assert a.stop() == 0
    lines = [line for line in a.log().splitlines() if line.strip()]
    assert lines and not any(line.startswith("{") for line in lines)
    assert any(" stub-worker INFO worker process " in line for line in lines)
