"""SWIM in real ``p2pnode start`` daemons on loopback, default LAN settings.

One cluster lives through the whole story, to pay the daemons' start-up once:
a fourth node joins through one seed; a node frozen 3 s with SIGSTOP is at most suspected;
the seed is SIGKILLed and declared dead by every survivor; a node stopped with SIGTERM is
seen as *left*; a new node joins through a surviving member; the killed seed comes back
with the same state dir, so the same id and a higher incarnation.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from nodes import NodeProc, get_json, wait_for

pytestmark = pytest.mark.slow

# SWIM with its LAN defaults; training stops early so the two shared cores go to the protocol
SWIM = ["--set", "membership.protocol=swim", "--set", "training.max_samples=128",
        "--set", "checkpoint.interval=1"]


def view(node: NodeProc) -> dict[str, tuple[str, int]]:
    """node id -> (state, incarnation) as ``node`` sees the cluster."""
    return {m["node_id"]: (m["state"], m["incarnation"]) for m in node.status()["members"]}


def all_see(observers: list[NodeProc], node_id: str, state: str) -> bool:
    return all(view(o).get(node_id, ("?", 0))[0] == state for o in observers)


def watch(observers: list[NodeProc], seconds: float, interval: float = 0.1) -> list[dict[str, Any]]:
    """Poll every observer's view for ``seconds``; return the observations."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for o in observers:
            try:
                seen.append(view(o))
            except OSError:
                pass
        time.sleep(interval)
    return seen


def started_listening(node: NodeProc, timeout: float = 60.0) -> float:
    """Poll until the node's HTTP server answers; the time it first did."""
    return wait_for(lambda: node.status() and time.monotonic(), timeout, f"{node.name} to listen", interval=0.05)


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
    d.wait_ready()
    wait_for(lambda: sum(s == "alive" for s, _ in view(d).values()) == 4, 5, "d to see everyone")

    # 2. frozen for 3 s: suspected at most, never dead, and it refutes
    inc_before = view(b)[ids["b"]][1]
    b.signal(signal.SIGSTOP)
    try:
        seen = watch([a, c, d], 3.0)
    finally:
        b.signal(signal.SIGCONT)
    seen += watch([a, c, d], 6.0)
    states = {v[ids["b"]][0] for v in seen}
    assert "dead" not in states and "left" not in states, f"b was declared {states}"
    wait_for(lambda: all_see([a, c, d], ids["b"], "alive"), 10, "everyone to see b alive again")
    if "suspect" in states:
        assert view(b)[ids["b"]][1] > inc_before, "b was suspected but did not refute"

    # 3. the seed is SIGKILLed: every survivor marks it dead within 15 s
    a.signal(signal.SIGKILL)
    a.proc.wait(5)
    killed = time.monotonic()
    wait_for(lambda: all_see([b, c, d], ids["a"], "dead"), 15.0, "every survivor to mark a dead", interval=0.1)
    dead_after = time.monotonic() - killed

    # 4. SIGTERM: a graceful leave, seen as left (not dead) within 3 s
    c.signal(signal.SIGTERM)
    termed = time.monotonic()
    wait_for(lambda: all_see([b, d], ids["c"], "left"), 3.0, "b and d to see c as left", interval=0.05)
    left_after = time.monotonic() - termed
    assert c.proc.wait(15) == 0

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
        metrics = get_metrics(n)
        assert metrics["p2pnode_membership_deaths_total"] >= 1
        assert metrics["p2pnode_membership_leaves_total"] >= 1
        assert metrics['p2pnode_membership_probes_total{result="ack"}'] > 0


def get_metrics(node: NodeProc) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://{node.addr}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("p2pnode_membership_") and " " in line:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_status_payload_lists_swim_members(cluster) -> None:
    a = cluster("solo", extra=SWIM)
    started_listening(a)
    members = get_json(a.addr)["members"]
    assert [(m["state"], m["incarnation"]) for m in members] == [("alive", 0)]
    assert set(members[0]) >= {"node_id", "addr", "state", "incarnation"}
