"""The event loop's lag probe (daemon/looplag.py) sees a callback that holds the loop."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from p2pnode.daemon.looplag import LoopLag
from p2pnode.daemon.metrics import NodeMetrics


def test_a_blocked_loop_is_seen_as_a_stall() -> None:
    m = NodeMetrics(CollectorRegistry())
    lag = LoopLag(m.loop_lag, m.loop_lag_max, interval=0.01)

    async def main() -> None:
        probe = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)
        time.sleep(0.25)  # model-sized work done on the loop, as the daemon must never do
        await asyncio.sleep(0.05)
        probe.cancel()
    asyncio.run(main())
    s = lag.status()
    assert s["stalls_over_100ms"] >= 1
    assert 0.2 <= s["lag_max_s"] < 1.0
    assert s["probes"] >= 5
    assert m.loop_lag_max._value.get() == lag.longest
