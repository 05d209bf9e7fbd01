"""A real network partition: four daemons, each in its own Linux network namespace on one
bridge (benchlib.netns.Topology), cut into two groups by blackhole routes and healed.

    [ns: a1] [ns: a2]   |cut|   [ns: b1] [ns: b2]
        \\________ bridge (the test polls /v1/status through it) ________/

SWIM runs with short timings (``membership.probe_interval`` and friends) so that the story
takes seconds: during the cut each side declares the other dead; after the heal every node
must see every other alive again within one push-pull interval plus a margin, since only
push-pull (which also contacts dead members) tells the two sides about each other again.
Needs root and iproute2; skipped otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from benchlib.cluster import NodeProc
from benchlib.netns import Topology, unavailable
from nodes import FAST, STUB, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.netns]

PUSH_PULL_INTERVAL = 3.0
SWIM = [*STUB, "--set", "membership.protocol=swim", "--set", "training.max_samples=128",
        "--set", "membership.probe_interval=0.5", "--set", "membership.probe_timeout=0.25",
        "--set", f"membership.push_pull_interval={PUSH_PULL_INTERVAL}"]
PORT = 7101


def view(node: NodeProc) -> dict[str, str]:
    """node id -> state, as ``node`` sees the cluster."""
    return {m["node_id"]: m["state"] for m in node.status()["members"]}


def sees(node: NodeProc, ids: list[str], states: tuple[str, ...]) -> bool:
    v = view(node)
    return all(v.get(i) in states for i in ids)


@pytest.mark.timeout(180)
def test_partition_of_two_groups_heals(tmp_path: Path) -> None:
    if reason := unavailable():
        pytest.skip(reason)
    topo = Topology(4, tag=f"s{os.getpid() % 10000}", subnet=f"10.213.{os.getpid() % 250 + 1}")
    nodes: list[NodeProc] = []
    try:
        topo.up()
        for i, name in enumerate(("a1", "a2", "b1", "b2")):
            prefix, host = topo.place(i)
            seeds = [nodes[0].addr] if nodes else []
            nodes.append(NodeProc(tmp_path, name, [*FAST, *SWIM], seeds, PORT, host, prefix).start())
        ids = [wait_for(lambda n=n: n.status()["joined"] and n.status()["node_id"], 90, f"{n.name} to join")
               for n in nodes]
        for n in nodes:
            wait_for(lambda n=n: sees(n, ids, ("alive",)), 20, f"{n.name} to see all four alive")

        topo.partition([0, 1], [2, 3])
        cut = time.monotonic()
        groups = ((nodes[:2], ids[2:], ids[:2]), (nodes[2:], ids[:2], ids[2:]))
        for side, others, own in groups:
            for n in side:
                wait_for(lambda n=n, others=others: sees(n, others, ("dead",)), 40,
                         f"{n.name} to declare the other side dead")
                assert sees(n, own, ("alive",)), f"{n.name} lost its own side: {view(n)}"
        dead_after = time.monotonic() - cut

        topo.heal()
        healed = time.monotonic()
        for n in nodes:
            remaining = PUSH_PULL_INTERVAL + 5 - (time.monotonic() - healed)
            wait_for(lambda n=n: sees(n, ids, ("alive",)), max(remaining, 0.1),
                     f"{n.name} to see all four alive after the heal", interval=0.1)
        print(f"\nthe other side dead after {dead_after:.1f} s of partition; healed in "
              f"{time.monotonic() - healed:.1f} s")
    except BaseException:
        for n in nodes:
            sys.stderr.write(f"\n----- {n.name} -----\n{n.log()[-4000:]}\n")
        raise
    finally:
        for n in nodes:
            n.stop()
        topo.down()
