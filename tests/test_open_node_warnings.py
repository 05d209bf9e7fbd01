"""A node that anyone can talk to says so at start: no cluster secret is one warning; the simple
membership protocol without one is a second, since that protocol takes any member list and any
``leave`` it is sent (docs/MEMBERSHIP.md). SWIM, the default, refuses such claims from strangers,
so it gets only the first."""

from __future__ import annotations

from nodes import wait_for

STUB = ["--set", "training.worker=stub"]
SIMPLE_WARNING = "membership.protocol = simple without a secret"


def test_an_open_node_warns_and_simple_membership_warns_twice(cluster) -> None:
    simple = cluster("simple", extra=[*STUB, "--set", "membership.protocol=simple"])
    swim = cluster("swim", extra=STUB)
    for node in (simple, swim):
        node.wait_ready()
        wait_for(lambda node=node: "no cluster secret" in node.log(), 10, f"{node.name}'s open-node warning")
    assert SIMPLE_WARNING in simple.log()
    assert SIMPLE_WARNING not in swim.log()
