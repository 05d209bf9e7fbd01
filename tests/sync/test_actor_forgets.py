"""A long-lived node's synchronous actor forgets the reducers it passed over once nothing reads
them (p2pnode/sync/actor.py, ``SyncActor._forget_the_past``): a stand-down long over, an
unreachable mark run out. Before, both maps kept an entry for every reducer ever passed over."""

from __future__ import annotations

import time

from p2pnode.config import Config
from p2pnode.membership.base import Member
from p2pnode.sync.actor import SyncActor
from p2pnode.sync.reducer import MAX_REPLAY


def test_stand_downs_and_unreachable_marks_are_dropped_once_nothing_reads_them() -> None:
    members = [Member(p, f"127.0.0.1:{7000 + i}") for i, p in enumerate("ab")]
    a = SyncActor(Config(), None, None, "c", lambda: members, lambda: 0, lambda request: None)  # type: ignore[arg-type]
    a.making = 100
    a.passed_over = {"a": 150, "b": 90, "gone": 100 - MAX_REPLAY}
    a.unreachable = {"b": time.monotonic() + 60, "gone": time.monotonic() - 1}
    a._forget_the_past()
    # "a" still rests; "b" came back 10 rounds ago, within what a node behind could replay across
    assert a.passed_over == {"a": 150, "b": 90}
    assert set(a.unreachable) == {"b"}
    assert a.reducer_of(a.making) == ("c", "")  # a rests, b is unreachable: the answer is unchanged
    a.making = 90 + MAX_REPLAY
    a._forget_the_past()
    assert a.passed_over == {"a": 150}
    assert a._across_stand_down("b", "a")  # a still rests: read from "a"'s entry, not "b"'s
