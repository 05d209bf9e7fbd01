"""The member table and the rules that order updates about one member.

An update is ``(state, incarnation)`` about a node. Only the node itself raises its
incarnation (to refute a suspicion, or when it restarts), so a higher incarnation is newer
news; at the same incarnation the graver state wins. Precisely (SWIM section 4.2, memberlist):

=========  =====================================================================
update     replaces the local record when the local record is ...
=========  =====================================================================
alive(i)   unknown, or anything with incarnation < i
suspect(i) alive with incarnation <= i, or suspect with incarnation < i
dead(i)    alive or suspect with incarnation <= i, or dead with incarnation < i
left(i)    alive, suspect or dead with incarnation <= i, or left with incarnation < i
=========  =====================================================================

Suspect, dead and left about an unknown node are ignored: we cannot reach it anyway, and a
later alive (at any incarnation) introduces it. Updates about this node itself never go
through these rules: the protocol refutes them instead (see node.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from p2pnode.membership.base import Member, MemberState

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT


def supersedes(new_state: MemberState, new_inc: int, old_state: MemberState | None, old_inc: int = 0) -> bool:
    """Whether an update ``(new_state, new_inc)`` replaces a record ``(old_state, old_inc)``."""
    if old_state is None:
        return new_state == ALIVE
    if new_state == ALIVE:
        return new_inc > old_inc
    if new_state == SUSPECT:
        return (old_state == ALIVE and new_inc >= old_inc) or (old_state == SUSPECT and new_inc > old_inc)
    if new_state == DEAD:
        return (old_state in (ALIVE, SUSPECT) and new_inc >= old_inc) or (old_state == DEAD and new_inc > old_inc)
    if new_state == LEFT:
        return (old_state != LEFT and new_inc >= old_inc) or (old_state == LEFT and new_inc > old_inc)
    raise ValueError(f"unknown state {new_state!r}")


@dataclass(frozen=True)
class Transition:
    """What an accepted update changed; ``before`` is None for a member we had never seen."""

    member: Member
    before: MemberState | None
    before_incarnation: int

    @property
    def state_changed(self) -> bool:
        return self.before != self.member.state


class MemberTable:
    """Every member known to this node, itself included, keyed by node id."""

    def __init__(self, local: Member, max_members: int = 16384) -> None:
        self.local = local
        self.max_members = max_members
        self._members: dict[str, Member] = {local.node_id: local}

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._members

    def __iter__(self) -> Iterator[Member]:
        return iter(self._members.values())

    def get(self, node_id: str) -> Member | None:
        return self._members.get(node_id)

    def others(self, *states: MemberState) -> list[Member]:
        """Members other than this node, in the given states (all states when none given)."""
        return [m for m in self._members.values()
                if m is not self.local and (not states or m.state in states)]

    def live_count(self) -> int:
        """Members believed to be running (alive or suspect), this node included: SWIM's n."""
        return sum(1 for m in self._members.values() if m.state in (ALIVE, SUSPECT))

    def counts(self) -> dict[MemberState, int]:
        out = dict.fromkeys(MemberState, 0)
        for m in self._members.values():
            out[m.state] += 1
        return out

    def apply(self, node_id: str, state: MemberState, incarnation: int, addr: str | None,
              now: float) -> Transition | None:
        """Merge one update about another node; return what changed, or None if it was stale."""
        if node_id == self.local.node_id:
            raise ValueError("updates about this node are refuted, not merged")
        member = self._members.get(node_id)
        if member is None:
            if state != ALIVE or addr is None or len(self._members) >= self.max_members:
                return None
            member = self._members[node_id] = Member(node_id, addr, ALIVE, incarnation, now)
            return Transition(member, None, incarnation)
        if not supersedes(state, incarnation, member.state, member.incarnation):
            return None
        before, before_inc = member.state, member.incarnation
        member.incarnation = incarnation
        if state == ALIVE and addr is not None:
            member.addr = addr  # a node that came back may have moved
        if state != before:
            member.state = state
            member.changed_at = now
        return Transition(member, before, before_inc)

    def reap(self, now: float, dead_after: float, left_after: float) -> list[Member]:
        """Forget members dead or left for longer than the given times; return them."""
        gone = [m for m in self._members.values() if m is not self.local and (
            (m.state == DEAD and now - m.changed_at > dead_after)
            or (m.state == LEFT and now - m.changed_at > left_after))]
        for m in gone:
            del self._members[m.node_id]
        return gone
