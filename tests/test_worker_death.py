"""A training worker killed with SIGKILL: the daemon notices, restarts it from the last
checkpoint, counts the restart, and training goes on; /healthz says 503 while it is down
(the stub worker: supervision is the daemon's). A torch checkpoint of another model stops the
node instead of restarting the worker for ever."""

from __future__ import annotations

import os
import signal
import time

import pytest

from daemon_util import http_request, metrics_text, pid_alive, sample_value, worker_pid
from nodes import STUB, wait_for


@pytest.mark.timeout(90)
def test_killed_worker_is_restarted_from_checkpoint(cluster) -> None:
    node = cluster("a", extra=STUB)
    node.wait_ready()
    wait_for(lambda: (node.status()["training"]["last_checkpoint_step"] or 0) >= 5, 30, "a checkpoint")
    assert sample_value(metrics_text(node.addr), "p2pnode_worker_restarts_total") == 0
    old = worker_pid(node.proc.pid)
    ckpt_step = node.status()["training"]["last_checkpoint_step"]

    os.kill(old, signal.SIGKILL)
    # While it is down the daemon still answers, and says it is not healthy.
    codes, alive_seen = set(), set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, _, _ = http_request(node.addr, "GET", "/healthz")
        codes.add(status)
        t = node.status()["training"]
        alive_seen.add(t["worker_alive"])
        if status == 200 and t["worker_alive"] and t["worker_restarts"] == 1:
            break
        time.sleep(0.1)
    assert 503 in codes and False in alive_seen, f"never seen down: /healthz {codes}, alive {alive_seen}"

    s = wait_for(lambda: (s := node.status())["training"]["worker_alive"] and s, 30, "the worker to be back")
    t = s["training"]
    assert t["worker_restarts"] == 1 and t["resumed"], t
    assert t["step"] >= ckpt_step, f"restarted at step {t['step']}, the checkpoint had {ckpt_step}"
    new = worker_pid(node.proc.pid)
    assert new != old and not pid_alive(old)
    assert sample_value(metrics_text(node.addr), "p2pnode_worker_restarts_total") == 1
    assert http_request(node.addr, "GET", "/healthz")[0] == 200
    # ... and training goes on.
    wait_for(lambda: node.status()["training"]["step"] > t["step"] + 5, 30, "training to go on")
    assert node.proc.poll() is None


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_checkpoint_of_another_model_stops_the_node(cluster) -> None:
    """A checkpoint that does not fit the model would crash every restarted worker: the node
    must stop with exit code 1 and say why, not restart the worker forever."""
    import torch

    from p2pnode.checkpoint import CHECKPOINT_NAME, save

    node = cluster("a")
    node.proc.kill()  # only its state dir is wanted; restarted below with the bad checkpoint
    node.proc.wait()
    save(node.state_dir / CHECKPOINT_NAME, {"model": {"other.weight": torch.zeros(3)}, "optimizer": {},
                                            "step": 7, "samples": 448})
    node.start()
    assert node.proc.wait(45) == 1, node.log()[-3000:]
    log = node.log()
    assert "does not fit this model" in log and "move it away" in log
    assert log.count("restarting from the last checkpoint") == 0
