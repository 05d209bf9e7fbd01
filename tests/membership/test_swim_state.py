"""Incarnation ordering and the member table's merge rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pnode.membership.base import Member, MemberState
from p2pnode.membership.swim.state import ALIVE, DEAD, LEFT, SUSPECT, MemberTable, supersedes

STATES = [ALIVE, SUSPECT, DEAD, LEFT]


@pytest.mark.parametrize("new,new_inc,old,old_inc,expected", [
    # alive needs a strictly higher incarnation, whatever the old state
    (ALIVE, 1, ALIVE, 0, True), (ALIVE, 0, ALIVE, 0, False), (ALIVE, 1, SUSPECT, 1, False),
    (ALIVE, 2, SUSPECT, 1, True), (ALIVE, 3, DEAD, 2, True), (ALIVE, 2, DEAD, 2, False),
    (ALIVE, 5, LEFT, 4, True), (ALIVE, 4, LEFT, 4, False), (ALIVE, 0, None, 0, True),
    # suspect beats alive at the same incarnation, suspect only at a higher one, never dead/left
    (SUSPECT, 1, ALIVE, 1, True), (SUSPECT, 0, ALIVE, 1, False), (SUSPECT, 2, ALIVE, 1, True),
    (SUSPECT, 1, SUSPECT, 1, False), (SUSPECT, 2, SUSPECT, 1, True),
    (SUSPECT, 9, DEAD, 1, False), (SUSPECT, 9, LEFT, 1, False), (SUSPECT, 0, None, 0, False),
    # dead beats alive and suspect at the same incarnation or later, not an older incarnation
    (DEAD, 1, ALIVE, 1, True), (DEAD, 0, ALIVE, 1, False), (DEAD, 1, SUSPECT, 1, True),
    (DEAD, 1, DEAD, 1, False), (DEAD, 2, DEAD, 1, True), (DEAD, 5, LEFT, 1, False), (DEAD, 0, None, 0, False),
    # left beats everything but a newer life; it also upgrades a dead record
    (LEFT, 1, ALIVE, 1, True), (LEFT, 1, SUSPECT, 1, True), (LEFT, 1, DEAD, 1, True),
    (LEFT, 0, DEAD, 1, False), (LEFT, 1, LEFT, 1, False), (LEFT, 2, LEFT, 1, True), (LEFT, 0, None, 0, False),
])
def test_supersedes_table(new, new_inc, old, old_inc, expected) -> None:
    assert supersedes(new, new_inc, old, old_inc) is expected


@given(st.sampled_from(STATES), st.integers(0, 5), st.sampled_from(STATES), st.integers(0, 5))
def test_ordering_is_antisymmetric_and_incarnation_monotone(s1, i1, s2, i2) -> None:
    # two different records never both replace each other: merges converge whatever the order
    if (s1, i1) != (s2, i2):
        assert not (supersedes(s1, i1, s2, i2) and supersedes(s2, i2, s1, i1))
    # nothing with an older incarnation replaces a newer record
    if i1 < i2:
        assert not supersedes(s1, i1, s2, i2)
    # a record never replaces itself
    assert not supersedes(s1, i1, s1, i1)


def test_table_new_member_only_through_alive() -> None:
    t = MemberTable(Member("me", "h:1"))
    assert t.apply("x", SUSPECT, 3, None, 1.0) is None
    assert t.apply("x", DEAD, 3, None, 1.0) is None
    assert "x" not in t
    tr = t.apply("x", ALIVE, 3, "h:2", 1.0)
    assert tr is not None and tr.before is None and tr.state_changed
    assert t.get("x").addr == "h:2" and t.get("x").incarnation == 3
    with pytest.raises(ValueError):
        t.apply("me", DEAD, 9, None, 1.0)


def test_table_transitions_and_address_change() -> None:
    t = MemberTable(Member("me", "h:1"))
    t.apply("x", ALIVE, 0, "h:2", 0.0)
    tr = t.apply("x", SUSPECT, 0, None, 5.0)
    assert tr.before == ALIVE and t.get("x").state == SUSPECT and t.get("x").changed_at == 5.0
    assert t.apply("x", ALIVE, 0, "h:2", 6.0) is None  # the suspect must refute with a higher incarnation
    tr = t.apply("x", DEAD, 0, None, 7.0)
    assert tr.before == SUSPECT and t.get("x").state == DEAD
    tr = t.apply("x", ALIVE, 1, "h:9", 8.0)  # came back elsewhere
    assert tr.before == DEAD and t.get("x").addr == "h:9" and t.get("x").state == ALIVE
    assert t.live_count() == 2 and t.counts()[MemberState.ALIVE] == 2


def test_table_bounded_and_reap() -> None:
    t = MemberTable(Member("me", "h:1"), max_members=3)
    for i in range(5):
        t.apply(f"x{i}", ALIVE, 0, f"h:{i + 2}", 0.0)
    assert len(t) == 3
    t.apply("x0", DEAD, 0, None, 10.0)
    t.apply("x1", LEFT, 0, None, 10.0)
    assert [m.node_id for m in t.reap(15.0, dead_after=10.0, left_after=3.0)] == ["x1"]
    assert "x1" not in t and "x0" in t
    assert [m.node_id for m in t.reap(25.0, dead_after=10.0, left_after=3.0)] == ["x0"]
    assert [m.node_id for m in t] == ["me"]
