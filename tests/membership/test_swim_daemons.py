"""SWIM in real ``p2pnode start`` daemons on loopback, with short timings.

One cluster lives through the whole story, to pay the daemons' start-up once:
a fourth node joins through one seed; a node frozen (SIGSTOP) for half the suspicion timeout
is at most suspected; the seed is SIGKILLed and declared dead by every survivor; a node
stopped with SIGTERM is seen as *left*; a new node joins through a surviving member; the
killed seed comes back with the same state dir, so the same id and a higher incarnation.

The timings are the LAN profile's shape scaled down (``membership.probe_interval`` and
friends), so every bound below is in the same proportion to them as in production; the nodes
run the torch-free stub worker (membership is what is tested), so each starts in about a second.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from daemon_util import metrics_text, sample_value
from nodes import STUB, NodeProc, get_json, wait_for

PROBE_INTERVAL = 0.5
SUSPICION_MULT = 6
#: the suspicion timeout's floor below 10 members: suspicion_mult * probe_interval
SUSPICION_MIN = SUSPICION_MULT * PROBE_INTERVAL
SWIM = [*STUB, "--set", "membership.protocol=swim", "--set", "training.max_samples=128",
        "--set", "checkpoint.interval=1", "--set", f"membership.probe_interval={PROBE_INTERVAL}",
        "--set", "membership.probe_timeout=0.25", "--set", f"membership.suspicion_mult={SUSPICION_MULT}",
        "--set", "membership.push_pull_interval=5"]


def view(node: NodeProc) -> dict[str, tuple[str, int]]:
    """node id -> (state, incarnation) as ``node`` sees the cluster."""
    return {m["node_id"]: (m["state"], m["incarnation"]) for m in node.status()["members"]}


def all_see(observers: list[NodeProc], node_id: str, state: str) -> bool:
    return all(view(o).get(node_id, ("?", 0))[0] == state for o in observers)


def watch(observers: list[NodeProc], until: float, interval: float = 0.1) -> list[dict[str, Any]]:
    """Poll every observer's view until the monotonic time ``until``; the observations."""
    seen = []
    while time.monotonic() < until:
        for o in observers:
            try:
                seen.append(view(o))
            except OSError:
                pass
        time.sleep(interval)
    return seen


def states_of(seen: list[dict[str, Any]], node_id: str) -> set[str]:
    return {v[node_id][0] for v in seen if node_id in v}


def joined(node: NodeProc, timeout: float = 60.0) -> float:
    """Poll until the node has joined (the daemon joins once its training worker is ready, so
    it can serve its model); the time it was first seen joined."""
    return wait_for(lambda: node.status()["joined"] and time.monotonic(), timeout, f"{node.name} to join",
                    interval=0.05)


@pytest.mark.timeout(240)
def test_swim_daemons_join_freeze_kill_leave_rejoin(cluster) -> None:
    a = cluster("a", extra=SWIM)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=SWIM)
    c = cluster("c", seeds=[a.addr], extra=SWIM)
    ids = {n.name: n.wait_ready()["node_id"] for n in (a, b, c)}
    for n in (a, b, c):
        wait_for(lambda n=n: sum(s == "alive" for s, _ in view(n).values()) == 3, 10, f"{n.name} to see all")

    # 1. a fourth node started with one seed's address is seen alive by every member within 5 s
    #    (of its join, which the daemon makes once the node's training worker is up)
    d = cluster("d", seeds=[a.addr], extra=SWIM)
    t0 = joined(d)
    ids["d"] = d.status()["node_id"]
    wait_for(lambda: all_see([a, b, c], ids["d"], "alive"), 5.0, "every member to see d alive", interval=0.05)
    joined_after = time.monotonic() - t0
    wait_for(lambda: sum(s == "alive" for s, _ in view(d).values()) == 4, 5, "d to see everyone")

    # 2. frozen for half the suspicion timeout: suspected at most, never dead, and it refutes;
    #    watched until every other member sees it alive again
    inc_before = view(b)[ids["b"]][1]
    b.signal(signal.SIGSTOP)
    try:
        seen = watch([a, c, d], time.monotonic() + SUSPICION_MIN / 2)
    finally:
        b.signal(signal.SIGCONT)
    resumed = time.monotonic()
    while not all_see([a, c, d], ids["b"], "alive"):
        assert time.monotonic() - resumed < 10, f"b not seen alive by everyone 10 s after it resumed: {states_of(seen, ids['b'])}"
        seen += watch([a, c, d], time.monotonic() + 0.1)
    states = states_of(seen, ids["b"])
    assert "dead" not in states and "left" not in states, f"b was declared {states}"
    if "suspect" in states:
        assert view(b)[ids["b"]][1] > inc_before, "b was suspected but did not refute"

    # 3. the seed is SIGKILLed: every survivor marks it dead within the longest suspicion
    #    timeout (6x the floor with no confirmation) plus a few probe periods
    a.signal(signal.SIGKILL)
    assert a.proc is not None
    a.proc.wait(5)
    killed = time.monotonic()
    wait_for(lambda: all_see([b, c, d], ids["a"], "dead"), 6 * SUSPICION_MIN + 6 * PROBE_INTERVAL,
             "every survivor to mark a dead", interval=0.1)
    dead_after = time.monotonic() - killed

    # 4. SIGTERM: a graceful leave, seen as left (not dead) within 3 s
    c.signal(signal.SIGTERM)
    termed = time.monotonic()
    wait_for(lambda: all_see([b, d], ids["c"], "left"), 3.0, "b and d to see c as left", interval=0.05)
    left_after = time.monotonic() - termed
    assert c.proc is not None and c.proc.wait(15) == 0

    # 5. with the seed gone, a new node joins through another member
    e = cluster("e", seeds=[d.addr], extra=SWIM)
    joined(e)
    ids["e"] = e.status()["node_id"]
    wait_for(lambda: all_see([b, d], ids["e"], "alive"), 5.0, "b and d to see e alive", interval=0.05)
    wait_for(lambda: {i for i, (s, _) in view(e).items() if s == "alive"} == {ids["b"], ids["d"], ids["e"]}, 5,
             "e to see b and d")

    # 6. the killed seed restarts from its state dir (no --seed: it remembers members): same id,
    #    higher incarnation, alive again everywhere
    inc_dead = view(b)[ids["a"]][1]
    a.start()
    joined(a)
    assert a.status()["node_id"] == ids["a"]
    wait_for(lambda: all_see([b, d, e], ids["a"], "alive"), 10, "everyone to see a alive again")
    assert view(b)[ids["a"]][1] > inc_dead

    print(f"\njoin seen by all after {joined_after:.2f} s; SIGKILL dead after {dead_after:.2f} s; "
          f"SIGTERM left after {left_after:.2f} s; states of the frozen node: {sorted(states)}")
    for n in (b, d):
        text = metrics_text(n.addr)
        assert sample_value(text, "p2pnode_membership_deaths_total") >= 1
        assert sample_value(text, "p2pnode_membership_leaves_total") >= 1
        assert sample_value(text, "p2pnode_membership_probes_total", {"result": "ack"}) > 0


def test_status_payload_lists_swim_members(cluster) -> None:
    a = cluster("solo", extra=SWIM)
    wait_for(lambda: a.status(), 60, "solo to listen", interval=0.05)
    members = get_json(a.addr)["members"]
    assert [(m["state"], m["incarnation"]) for m in members] == [("alive", 0)]
    assert set(members[0]) >= {"node_id", "addr", "state", "incarnation"}
