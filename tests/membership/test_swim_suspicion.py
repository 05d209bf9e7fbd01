"""Lifeguard's suspicion timer: starts long, shrinks with independent confirmations."""

from __future__ import annotations

import asyncio
import math

import pytest

from benchlib.swim_sim import run_virtual
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.suspicion import Suspicion, remaining_suspicion_time, suspicion_timeout


def test_timeout_shrinks_on_a_log_scale() -> None:
    lo, hi, k = 4.0, 24.0, 2
    timeouts = [suspicion_timeout(c, k, lo, hi) for c in range(k + 1)]
    assert timeouts[0] == hi and timeouts[-1] == lo
    assert timeouts == sorted(timeouts, reverse=True)
    # log-scaled: the first confirmation removes log(2)/log(3) = 63 % of the range
    assert timeouts[1] == pytest.approx(hi - (hi - lo) * math.log(2) / math.log(3), abs=1e-3)
    assert suspicion_timeout(5, k, lo, hi) == lo  # never below the floor
    assert suspicion_timeout(0, 0, lo, hi) == lo  # no confirmations expected: floor at once


def test_remaining_time_matches_memberlist() -> None:
    # memberlist suspicion_test.go TestSuspicion_remainingSuspicionTime
    cases = [(0, 3, 0, 2, 30, 30.0), (1, 3, 2, 2, 30, 14.0), (2, 3, 3, 2, 30, 4.810),
             (3, 3, 4, 2, 30, -2.0), (4, 3, 5, 2, 30, -3.0), (5, 3, 10, 2, 30, -8.0)]
    for n, k, elapsed, lo, hi, expected in cases:
        assert remaining_suspicion_time(n, k, elapsed, lo, hi) == pytest.approx(expected, abs=1e-3)


def test_config_formulas_follow_memberlist() -> None:
    cfg = SwimConfig.lan()
    assert cfg.suspicion_timeouts(1) == (4.0, 24.0)
    assert cfg.suspicion_timeouts(4) == (4.0, 24.0)  # log10 scale only above 10 members
    lo, hi = cfg.suspicion_timeouts(256)
    assert lo == pytest.approx(4 * math.log10(256)) and hi == pytest.approx(6 * lo)
    assert cfg.suspicion_confirmations(3) == 0 and cfg.suspicion_confirmations(4) == 2
    assert cfg.retransmit_limit(3) == 4 and cfg.retransmit_limit(16) == 8 and cfg.retransmit_limit(256) == 12
    assert cfg.push_pull_period(32) == 30.0 and cfg.push_pull_period(256) == 120.0


def _run_suspicion(k: int, confirm_at: list[tuple[float, str]]) -> tuple[float | None, list[bool]]:
    async def main() -> tuple[float | None, list[bool]]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        s = Suspicion("origin", k, 4.0, 24.0, lambda c: fired.append(loop.time()))
        results = []
        t0 = loop.time()
        for at, sender in confirm_at:
            await asyncio.sleep(t0 + at - loop.time())
            results.append(s.confirm(sender))
        await asyncio.sleep(30)
        assert len(fired) <= 1
        return (fired[0] - t0 if fired else None), results

    return run_virtual(main)


def test_timer_fires_at_max_without_confirmations() -> None:
    fired, _ = _run_suspicion(2, [])
    assert fired == pytest.approx(24.0)


def test_confirmations_shrink_the_running_timer() -> None:
    fired, results = _run_suspicion(2, [(1.0, "b"), (2.0, "c")])
    assert results == [True, True]
    assert fired == pytest.approx(4.0)  # the floor, counted from the start


def test_duplicate_and_originator_confirmations_do_not_count() -> None:
    fired, results = _run_suspicion(2, [(1.0, "origin"), (1.5, "b"), (2.0, "b")])
    assert results == [False, True, False]
    assert fired == pytest.approx(suspicion_timeout(1, 2, 4.0, 24.0))


def test_late_confirmation_fires_at_once_and_extra_ones_are_ignored() -> None:
    fired, results = _run_suspicion(2, [(3.0, "b"), (5.0, "c"), (5.5, "d")])
    assert results == [True, True, False]  # fired already: "d" is not news
    assert fired == pytest.approx(5.0)  # past the 4 s floor already: expires on the second confirmation


def test_cancelled_timer_never_fires() -> None:
    async def main() -> list[int]:
        fired: list[int] = []
        s = Suspicion("a", 2, 1.0, 2.0, fired.append)
        s.cancel()
        await asyncio.sleep(5)
        return fired

    assert run_virtual(main) == []
