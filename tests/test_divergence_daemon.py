"""A real daemon whose worker sees non-finite losses keeps running: a hostile-input run saw a node on defaults
log non-finite losses for hundreds of steps, and once its worker's "restoring the model from its
public copy" ended in exit 1. Here a node (torch worker, synthetic data) trains with a step size
far too large (lr 1e5, no gradient clipping, no warm-up): its first steps diverge, each time the
worker restores its model from its public copy and halves the step, and within a few steps the
loss stays finite. The node never exits, the worker is never restarted (same process), status
and metrics count the non-finite losses and show the reduced step size, the model it serves
stays finite, and it finishes its training. (tests/test_divergence.py drives the worker alone.)"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import pytest
from daemon_util import fetch_snapshot, metrics_text, sample_value, worker_pid
from nodes import NodeProc

pytestmark = pytest.mark.slow

LR = 1e5
STEPS = 100  # 6400 samples of 64
DIVERGING = ["--set", f"training.lr={LR:g}", "--set", "training.grad_clip=0", "--set", "training.warmup_samples=0",
             "--set", "training.synthetic_samples=512", "--set", f"training.max_samples={64 * STEPS}",
             "--set", "training.eval_every=50"]


@pytest.mark.timeout(120)
def test_a_diverging_node_recovers_in_a_few_steps_and_finishes(cluster: Callable[..., NodeProc]) -> None:
    node = cluster("a", extra=DIVERGING)
    node.wait_ready(60)
    worker = worker_pid(node.pid)
    seen: list[tuple[int, int, float]] = []  # (step, non-finite losses so far, lr) as status showed them
    deadline = time.monotonic() + 60
    while True:
        assert node.proc is not None and node.proc.poll() is None, f"the node exited ({node.proc.returncode})"
        t = node.status()["training"]
        assert t["worker_restarts"] == 0 and t["worker_alive"], t
        seen.append((t["step"], t["nonfinite"], t["lr"]))
        if t["done"]:
            break
        assert time.monotonic() < deadline, f"training not done in 60 s: {t}"
        time.sleep(0.2)
    assert worker_pid(node.pid) == worker  # the same worker process throughout

    nonfinite = seen[-1][1]
    assert nonfinite >= 1, f"lr {LR:g} should diverge, or this test shows nothing: {seen[-5:]}"
    assert nonfinite <= 12, f"{nonfinite} non-finite losses in {STEPS} steps: no recovery"
    # recovered within a few steps: the count stops growing early, not once every step or so
    last_growth = next(step for step, count, _ in seen if count == nonfinite)
    assert last_growth <= 40, f"still diverging at step {last_growth}: {seen}"
    # the step size was cut (halved once per non-finite loss), and shown so
    assert min(lr for _, count, lr in seen if count == nonfinite) <= LR * 0.5 ** nonfinite * 1.0001, seen
    t = node.status()["training"]
    assert t["done"] and t["step"] == STEPS and t["nonfinite"] == nonfinite, t
    assert t["loss"] is not None and math.isfinite(t["loss"]), t  # status shows null for a non-finite one
    assert sample_value(metrics_text(node.addr), "p2pnode_training_nonfinite_losses_total") == nonfinite
    # what it serves (its public copy) stayed finite
    _, snap, _ = fetch_snapshot(node.addr)
    assert all(np.isfinite(a).all() for a in snap.tensors.values())
    assert "non-finite loss at step" in node.log()
    assert node.stop() == 0
