"""A real daemon stops gracefully on SIGTERM and SIGINT: exit 0 quickly, final checkpoint, peers see it leave."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from daemon_util import pid_alive, worker_pid
from nodes import STUB, wait_for
from p2pnode.checkpoint import CHECKPOINT_NAME, load
from p2pnode.worker.stub import CHECKPOINT_NAME as STUB_CHECKPOINT


def member_state(status: dict, node_id: str) -> str | None:
    return next((m["state"] for m in status["members"] if m["node_id"] == node_id), None)


def stop_and_time(node, sig: int) -> float:
    started = time.monotonic()
    node.signal(sig)
    try:
        code = node.proc.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{node.name} still running 10 s after {signal.Signals(sig).name}")
    took = time.monotonic() - started
    assert code == 0, f"{node.name} exited with {code} after {signal.Signals(sig).name}"
    return took


def checkpoint_path(state_dir: Path, worker: str) -> Path:
    return state_dir / (STUB_CHECKPOINT if worker == "stub" else CHECKPOINT_NAME)


def final_checkpoint_step(state_dir: Path, worker: str) -> int:
    path = checkpoint_path(state_dir, worker)
    assert path.exists(), "no checkpoint written"
    state = msgpack.unpackb(path.read_bytes(), raw=False) if worker == "stub" else load(path)
    return int(state["step"])


# The stub worker for the daemon's part; the torch worker (slow) for its fsynced checkpoint and
# its quick exit (it skips the interpreter's teardown) within the same 10 s.
@pytest.mark.parametrize("worker", ["stub", pytest.param("torch", marks=pytest.mark.slow)])
@pytest.mark.timeout(90)
def test_sigterm_and_sigint_stop_gracefully(cluster, worker: str) -> None:
    # b and c write checkpoints only at shutdown: a checkpoint file proves the final one was written.
    chosen = ["--set", f"training.worker={worker}"]
    a = cluster("a", extra=chosen)
    b = cluster("b", seeds=[a.addr], extra=[*chosen, "--set", "checkpoint.interval=0"])
    c = cluster("c", seeds=[a.addr], extra=[*chosen, "--set", "checkpoint.interval=0"])
    ids = {n.name: n.wait_ready()["node_id"] for n in (a, b, c)}
    for n in (a, b, c):
        wait_for(lambda n=n: all(member_state(n.status(), i) == "alive" for i in ids.values()), 15,
                 f"{n.name} to see everyone")
    for n in (b, c):
        wait_for(lambda n=n: n.status()["training"]["step"] >= 5, 30, f"{n.name} to train")
        assert not checkpoint_path(n.state_dir, worker).exists()

    took = {}
    for n, sig, watchers in ((b, signal.SIGTERM, (a, c)), (c, signal.SIGINT, (a,))):
        step_seen = n.status()["training"]["step"]
        pid = worker_pid(n.proc.pid)
        took[n.name] = stop_and_time(n, sig)
        assert final_checkpoint_step(n.state_dir, worker) >= step_seen > 0
        assert not pid_alive(pid), f"the worker of {n.name} outlived its daemon"
        for w in watchers:
            wait_for(lambda w=w, n=n: member_state(w.status(), ids[n.name]) == "left", 5,
                     f"{w.name} to list {n.name} as left")
        assert "Traceback" not in n.log(), n.log()[-3000:]
    assert a.proc.poll() is None and a.status()["training"]["worker_alive"]
    print(f"stop took {took['b']:.2f} s (SIGTERM), {took['c']:.2f} s (SIGINT)")


@pytest.mark.timeout(60)
def test_sigterm_with_a_hung_worker_still_exits_within_10_s(cluster) -> None:
    """A worker that no longer answers (frozen here with SIGSTOP) cannot write the final
    checkpoint; the daemon says so, kills it, and still exits 0 within the 10 s systemd allows."""
    a = cluster("a", extra=STUB)
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["step"] >= 5, 30, "a to train")
    worker = worker_pid(a.proc.pid)
    os.kill(worker, signal.SIGSTOP)
    took = stop_and_time(a, signal.SIGTERM)
    assert not pid_alive(worker), "the frozen worker outlived its daemon"
    assert "the final checkpoint was not written" in a.log()
    print(f"stopped with a hung worker in {took:.1f} s")
