"""Lifeguard's suspicion timer (Dadgar et al. 2018, section IV-B; memberlist suspicion.go).

A suspicion starts with a long timeout, ``max``, and shrinks towards ``min`` as independent
members confirm it, on a log scale: after c of the k expected confirmations the timeout is

    max - (max - min) * log(c + 1) / log(k + 1)      (never below min)

measured from when the suspicion started here. A healthy but slow member so gets the most
time to refute when few others see it failing, while a member that really crashed, and which
everyone therefore suspects, is declared dead after ``min``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable


def suspicion_timeout(confirmations: int, k: int, min_timeout: float, max_timeout: float) -> float:
    """Total timeout after ``confirmations`` of ``k`` expected ones (k < 1: min at once)."""
    if k < 1:
        return min_timeout
    frac = math.log(confirmations + 1.0) / math.log(k + 1.0)
    raw = max_timeout - frac * (max_timeout - min_timeout)
    return max(min_timeout, math.floor(raw * 1000.0) / 1000.0)


def remaining_suspicion_time(confirmations: int, k: int, elapsed: float, min_timeout: float,
                             max_timeout: float) -> float:
    """memberlist's remainingSuspicionTime: what is left of the timeout after ``elapsed``."""
    return suspicion_timeout(confirmations, k, min_timeout, max_timeout) - elapsed


class Suspicion:
    """One running suspicion; ``on_timeout(confirmations)`` is called once when it expires.

    ``sender`` (who raised it) does not count as a confirmation; each other distinct sender
    does, up to ``k``. The timer runs on the event loop's clock, so a virtual-time loop
    (benchlib/swim_sim.py) drives it exactly like a real one.
    """

    def __init__(self, sender: str, k: int, min_timeout: float, max_timeout: float,
                 on_timeout: Callable[[int], None], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.k = k
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout
        self._on_timeout = on_timeout
        self._loop = loop or asyncio.get_running_loop()
        self.started = self._loop.time()
        self._senders = {sender}
        self.confirmations = 0
        self.fired = False
        timeout = max_timeout if k >= 1 else min_timeout
        self.deadline = self.started + timeout
        self._handle: asyncio.TimerHandle | asyncio.Handle = self._loop.call_at(self.deadline, self._fire)

    def confirm(self, sender: str) -> bool:
        """Count an independent confirmation; True if it was new (and so worth re-gossiping)."""
        if self.fired or self.confirmations >= self.k or sender in self._senders:
            return False
        self._senders.add(sender)
        self.confirmations += 1
        elapsed = self._loop.time() - self.started
        remaining = remaining_suspicion_time(self.confirmations, self.k, elapsed, self.min_timeout,
                                             self.max_timeout)
        self._handle.cancel()
        self.deadline = self._loop.time() + max(0.0, remaining)
        if remaining > 0:
            self._handle = self._loop.call_at(self.deadline, self._fire)
        else:
            self._handle = self._loop.call_soon(self._fire)
        return True

    def cancel(self) -> None:
        self._handle.cancel()

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self._on_timeout(self.confirmations)
