"""Lifeguard's local health multiplier (LHM; memberlist awareness.go).

A node that misses acks it should have got, or nacks its helpers should have sent, or that
learns it is itself suspected, is more likely the slow one than the others are dead. Its
health score goes up by one for each such sign and down by one for each successful probe,
within ``[0, max_multiplier - 1]``; probe intervals and timeouts are multiplied by
``score + 1``. A struggling node thus probes less often and waits longer before it accuses
anybody, instead of flooding the cluster with false suspicions.
"""

from __future__ import annotations


class Awareness:
    def __init__(self, max_multiplier: int = 8) -> None:
        if max_multiplier < 1:
            raise ValueError("max_multiplier must be >= 1")
        self.max_multiplier = max_multiplier
        self.score = 0

    def apply_delta(self, delta: int) -> int:
        """Move the score by ``delta`` (clamped); return the new score."""
        self.score = min(self.max_multiplier - 1, max(0, self.score + delta))
        return self.score

    @property
    def multiplier(self) -> int:
        return self.score + 1

    def scale(self, timeout: float) -> float:
        return timeout * (self.score + 1)
