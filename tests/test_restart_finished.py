"""A node restarted after its training ended (a kill in the consensus finish, or a reboot) says
so at once: done, its final evaluation, and exchanges with its peers again. Before, it waited
for steps that never came: never done, never exchanging (found by scripts/chaos.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from nodes import NodeProc, wait_for

pytestmark = pytest.mark.slow

SHORT = ["--set", "training.max_samples=640", "--set", "exchange.finish_interval=0.2"]


def finished(node: NodeProc) -> bool:
    t = node.status()["training"]
    return bool(t["done"]) and t["eval_step"] >= t["step"] > 0


@pytest.mark.timeout(180)
def test_a_node_restarted_after_training_is_done_and_exchanges(cluster: Callable[..., NodeProc]) -> None:
    a = cluster("a", extra=SHORT)  # both start at once (b joins through a when it answers)
    b = cluster("b", seeds=[a.addr], extra=SHORT)
    a.wait_ready(90)
    b.wait_ready(90)
    wait_for(lambda: finished(a) and finished(b), 120, "both nodes to finish training")
    step = b.status()["training"]["step"]
    assert b.stop() == 0
    b.start()
    b.wait_ready(90)
    wait_for(lambda: finished(b), 30, "the restarted node to say it is done")
    assert b.status()["training"]["step"] == step
    wait_for(lambda: b.status()["exchanges"]["done"] > 0, 30, "the restarted node to exchange again")
