"""A node saves a member it has not saved before within seconds, not at its next checkpoint:
a node killed before its first checkpoint (a seed node above all, which has no seeds of its
own) found nobody when it restarted, trained alone, and ended 3.5 pt under its cluster
(docs/archive/BENCHMARKS-history.md, the runs of 2026-11-26 11:19)."""

from __future__ import annotations

import json

from nodes import STUB, wait_for


def test_a_new_member_is_saved_within_seconds_not_at_the_next_checkpoint(cluster) -> None:
    slow = ["--set", "checkpoint.interval=3600"]  # no checkpoint (and no periodic save) in this test
    a = cluster("a", extra=[*STUB, *slow])
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=[*STUB, *slow])
    b.wait_ready()
    saved = a.state_dir / "members.json"
    wait_for(lambda: json.loads(saved.read_text()) == {"addrs": [b.addr]}, 10, "a to save b")
    wait_for(lambda: json.loads((b.state_dir / "members.json").read_text()) == {"addrs": [a.addr]}, 10, "b to save a")
    a.signal(9)  # killed before any checkpoint: it restarts with no seeds, and finds b by what it saved
    a.proc.wait(10)
    a.start()
    assert a.wait_ready(60)["joined"]
    wait_for(lambda: b.addr in {m["addr"] for m in a.status()["members"] if m["state"] == "alive"}, 15,
             "a to be back with b")
    assert "joined through " + b.addr in a.log()
