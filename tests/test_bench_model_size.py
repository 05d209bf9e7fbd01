"""scripts/bench_model_size.py's bookkeeping: a node's longest time without an exchange is
measured all through the window, the delta fetches' part of it included (polled only at their
start and end, a gap read 0 s whenever the node had exchanged once in between)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("bench_model_size", ROOT / "scripts" / "bench_model_size.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Statuses:
    """The two status fields Watch reads, for two nodes whose exchange counts the test sets."""

    def __init__(self) -> None:
        self.done = [0, 0]
        self.nodes = [None, None]

    def statuses(self) -> list[dict[str, Any]]:
        return [{"exchanges": {"done": d}} for d in self.done]


def test_gap_is_measured_between_the_window_s_ends() -> None:
    mod = load_script()
    cluster = Statuses()
    watch = mod.Watch(cluster, min_free=0)
    watch.start()
    watch.poll()  # the window's first poll
    # node 0 exchanges every 0.1 s; node 1 goes 1 s without, then exchanges once
    quiet_until = time.monotonic() + 1.0
    while time.monotonic() < quiet_until:
        time.sleep(0.1)
        cluster.done[0] += 1
        watch.poll_every(0.05)  # what delta_fetches' wait does between its probes
    cluster.done[1] += 1
    watch.poll()  # the window's last poll: node 1 has just exchanged
    assert watch.longest_gap[1] >= 0.9, watch.longest_gap
    assert watch.longest_gap[0] < 0.6, watch.longest_gap
