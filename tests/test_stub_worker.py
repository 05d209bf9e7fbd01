"""The worker seam: ``training.worker = "stub"`` runs real daemons with a numpy worker that
speaks the same pipe protocol and publishes a real model through the real codec, so tests of
membership, auth, TLS and lifecycle need no torch in the worker. This checks the stub is a
faithful stand-in where those tests rely on it: peers exchange sparse deltas, a SIGKILLed
worker is restarted from its checkpoint, and the worker process never loads torch. The
worker, first and restarted, runs below the daemon's CPU priority; the daemon's event loop
alone runs in the real-time class (``node.loop_priority = "auto"``, as root), unless told not to."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from daemon_util import worker_pid
from nodes import wait_for

from p2pnode.daemon.supervisor import WORKER_NICE

pytestmark = pytest.mark.slow

STUB = ["--set", "training.worker=stub"]
REALTIME = os.SCHED_RR | os.SCHED_RESET_ON_FORK


def nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def policies(pid: int) -> dict[int, int]:
    """Each thread of process ``pid``: its scheduling policy."""
    return {int(t): os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def loads_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.timeout(90)
def test_stub_worker_nodes_exchange_and_restart(cluster) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=[*STUB, "--set", "node.loop_priority=normal"])
    ids = {n.name: n.wait_ready()["node_id"] for n in (a, b)}
    for n, peer in ((a, "b"), (b, "a")):
        wait_for(lambda n=n, peer=peer: (n.status()["peers"].get(ids[peer]) or {}).get("ok", 0) >= 5, 30,
                 f"{n.name} to exchange with {peer}")
    s = a.status()
    assert s["exchanges"]["done"] >= 5 and s["bytes"]["model_received"] > 0 and s["bytes"]["model_served"] > 0
    assert s["training"]["fingerprint"] == "stub-1" and s["training"]["accuracy"] is not None
    assert s["bootstrapped_from"] is None and b.status()["bootstrapped_from"] == ids["a"]
    pid = worker_pid(a.proc.pid)
    assert not loads_torch(pid)
    assert nice(pid) == nice(a.proc.pid) + WORKER_NICE  # the daemon's loop gets a core first
    if os.geteuid() == 0:  # as root the loop's thread (the main one) is real-time, and nothing it started is
        assert a.status()["event_loop"]["scheduling"] == "realtime"
        threads = policies(a.proc.pid)
        assert threads.pop(a.proc.pid) == REALTIME and len(threads) >= 1
        assert set(threads.values()) == {os.SCHED_OTHER}, threads
        assert set(policies(pid).values()) == {os.SCHED_OTHER}
    assert b.status()["event_loop"]["scheduling"] == "normal"
    assert set(policies(b.proc.pid).values()) == {os.SCHED_OTHER}

    wait_for(lambda: (a.status()["training"]["last_checkpoint_step"] or 0) >= 10, 20, "a checkpoint")
    ckpt_step = a.status()["training"]["last_checkpoint_step"]
    os.kill(pid, signal.SIGKILL)
    t = wait_for(lambda: (t := a.status()["training"])["worker_restarts"] == 1 and t["worker_alive"] and t, 30,
                 "the worker to be restarted")
    assert t["resumed"] and t["step"] >= ckpt_step, t
    assert nice(worker_pid(a.proc.pid)) == nice(a.proc.pid) + WORKER_NICE
    assert set(policies(worker_pid(a.proc.pid)).values()) == {os.SCHED_OTHER}  # the restarted one too
    ok = a.status()["peers"][ids["b"]]["ok"]
    wait_for(lambda: a.status()["peers"][ids["b"]]["ok"] >= ok + 3, 20, "exchanges to resume")
    assert a.status()["peers"][ids["b"]]["failed"] == 0
