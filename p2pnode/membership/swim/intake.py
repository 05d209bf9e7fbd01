"""Which news from the network may change the member table: the rules for strangers.

SWIM trusts every message. On an open network (no cluster secret) that lets anyone steer
membership: invent members, point members at a third party's address, declare members dead or
left, or push an incarnation to its limit. ``judge`` decides, for one received update about
another node, before anything changes:

* **alive** about a node we do not know, or about a known node at a new address: *propose*
  it; it is a candidate until it answers our own ping there (verify.py). At most
  ``max_new_per_message`` proposals per received message (a reply we asked for may propose
  up to ``max_unverified``), none once the table holds ``max_members``;
* **alive** about a known node at its known address: applied if it comes from a member, or
  from the node itself (its refutation), else refused;
* **suspect**, **dead**, **left** about another node: only from a member (a node may say it
  leaves itself); a suspicion counts as a confirmation only if its accuser is a member;
* an incarnation above ``MAX_INCARNATION``, or more than ``max_incarnation_jump`` above the
  one we know, is refused (only the node itself raises its incarnation, one step at a time).

News about this node itself is refuted, not judged (core.py), and only when it comes from a
node we know in any state (a dead one included: that is how partitions heal) or in the reply
to our own push-pull: nobody else believes a stranger, so there is nothing to refute.

A *member* is a node in our table, verified, alive or suspect. The sender of a message is what
the message claims: these rules keep out strangers, not an impostor who copies a member's id
(the cluster secret does; docs/MEMBERSHIP.md, "Hostile input").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from p2pnode.membership.base import MAX_INCARNATION
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.messages import Alive, Left, Suspect, Update
from p2pnode.membership.swim.state import ALIVE, MemberTable, supersedes

APPLY = "apply"
PROPOSE = "propose"
IGNORE = "ignore"  # old news: nothing to do, nothing to count


@dataclass
class Intake:
    """Who sent one message's news, and how many unknown members it may still propose."""

    sender: str  # the node id the message claims to come from
    source: str  # what per-source bounds count: the sender's host when known, else its id
    from_member: bool  # the sender is a member verified here (alive or suspect)
    new_left: int
    #: a reply to our own request, to an address we chose (a seed, a member): its proposals
    #: are bounded by the verifier's room, not by a per-source share
    solicited: bool = False


def judge(u: Update, src: Intake, table: MemberTable, config: SwimConfig,
          is_member: Callable[[str], bool]) -> str:
    """APPLY, PROPOSE, IGNORE, or the reason for refusing (a metrics label).

    ``u`` is about another node (news about ourselves is refuted, not judged).
    """
    m = table.get(u.node)
    if u.incarnation > MAX_INCARNATION or (m is not None and u.incarnation > m.incarnation
                                           + config.max_incarnation_jump):
        return "incarnation"
    if isinstance(u, Alive):
        if m is not None and not (src.from_member or u.node == src.sender):
            return "stranger"
        if m is not None and u.addr == m.addr:
            return APPLY
        if m is not None and not supersedes(ALIVE, u.incarnation, m.state, m.incarnation):
            return IGNORE
        if m is None and len(table) >= config.max_members:
            return "table_full"
        if src.new_left <= 0:
            return "message_limit"
        return PROPOSE
    if not (src.from_member or (isinstance(u, Left) and u.node == src.sender)):
        return "stranger"
    if isinstance(u, Suspect) and u.sender != table.local.node_id and not is_member(u.sender):
        return "stranger"  # confirmations shorten suspicions: members only
    return APPLY


def about_self_refused(u: Update, incarnation: int, config: SwimConfig) -> bool:
    """An accusation (or alive claim) about this node far above its own incarnation: a lie or
    garbage, and following it could run the counter up to its limit."""
    return u.incarnation > min(MAX_INCARNATION - 1, incarnation + config.max_incarnation_jump)
