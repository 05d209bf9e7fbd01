"""The event loop's lag probe (daemon/looplag.py) sees a callback that holds the loop."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest

from prometheus_client import CollectorRegistry

from p2pnode.daemon.looplag import LoopLag, stolen
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


def test_the_longest_stall_says_whether_the_loop_worked_or_waited() -> None:
    """Work on the loop counts as on a core; a wait off it (a sleep here, as a wait for the
    interpreter lock would be) as off a core."""
    def stall(kind: str) -> dict[str, float]:
        m = NodeMetrics(CollectorRegistry())
        lag = LoopLag(m.loop_lag, m.loop_lag_max, interval=0.01)

        async def main() -> None:
            probe = asyncio.create_task(lag.run())
            await asyncio.sleep(0.05)
            end = time.monotonic() + 0.3
            if kind == "busy":
                while time.monotonic() < end:
                    pass
            else:
                time.sleep(0.3)
            await asyncio.sleep(0.05)
            probe.cancel()
        asyncio.run(main())
        assert lag.status()["lag_max_s"] >= 0.25
        split: dict[str, float] = lag.status()["lag_max_split"]
        return split

    busy, idle = stall("busy"), stall("sleep")
    # busy: ready to run throughout (on a core, or waiting for one on a loaded machine)
    assert busy["on_cpu_s"] + busy["waiting_for_cpu_s"] >= 0.25, busy
    assert busy["off_cpu_s"] < 0.1, busy
    assert idle["off_cpu_s"] >= 0.25, idle


def test_a_long_stall_is_logged_once_with_its_split(caplog: pytest.LogCaptureFixture) -> None:
    m = NodeMetrics(CollectorRegistry())
    lag = LoopLag(m.loop_lag, m.loop_lag_max, interval=0.01)

    async def main() -> None:
        probe = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)
        for _ in range(2):  # two stalls: one line (at most one a minute)
            time.sleep(0.3)
            await asyncio.sleep(0.05)
        probe.cancel()
    with caplog.at_level(logging.WARNING, logger="p2pnode.node"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "event loop answered nothing" in r.getMessage()]
    assert len(said) == 1 and "off a core" in said[0], said


def test_the_split_says_what_the_hypervisor_took(caplog: pytest.LogCaptureFixture) -> None:
    """The machine's steal time (/proc/stat) over the stall's window is in the split and, when
    there was any, in the logged line: a whole guest stalled by its host reads as "ran" or
    "waited for a core" in the thread's own counts."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    now = stolen()
    assert now is not None and abs(now - int(fields[8]) / 100) < 0.5, (now, fields)

    m = NodeMetrics(CollectorRegistry())
    lag = LoopLag(m.loop_lag, m.loop_lag_max, interval=0.01)
    with caplog.at_level(logging.WARNING, logger="p2pnode.node"):
        lag.note(0.3, 0.31, (1.0, 2.0), (1.05, 2.2), steal=0.12)
    split = lag.status()["lag_max_split"]
    assert split["stolen_s"] == 0.12 and split["on_cpu_s"] == 0.05 and split["waiting_for_cpu_s"] == 0.2, split
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "the hypervisor took 120 ms" in said[0], said

    async def main() -> None:  # the probe itself reads it around a real stall
        probe = asyncio.create_task(lag2.run())
        await asyncio.sleep(0.05)
        time.sleep(0.3)
        await asyncio.sleep(0.05)
        probe.cancel()
    m2 = NodeMetrics(CollectorRegistry())
    lag2 = LoopLag(m2.loop_lag, m2.loop_lag_max, interval=0.01)
    asyncio.run(main())
    split2 = lag2.status()["lag_max_split"]
    assert 0.0 <= split2["stolen_s"] <= 2 * split2["window_s"] * (os.cpu_count() or 1), split2
