"""Schedules, kept apart from compressors and memories.

* :class:`WarmupDensity`: DGC's warm-up (Lin et al. 2018, Sec. 3.3): early training changes
  fast, so start dense and shrink the density geometrically to its final value (DGC: 25 %,
  6.25 %, 1.5625 %, 0.4 % over the first four epochs).
* :class:`DelayedStart`: no compression at all for the first ``steps`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pnode.compression.base import CompressionConfigError

__all__ = ["WarmupDensity", "DelayedStart"]


@dataclass(frozen=True)
class WarmupDensity:
    """density(step) = start * (final / start) ** (step / steps), then ``final``."""

    final: float
    steps: int
    start: float = 0.25

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise CompressionConfigError(f"warm-up steps must be >= 0, got {self.steps}")
        if not (0.0 < self.final <= 1.0 and 0.0 < self.start <= 1.0):
            raise CompressionConfigError("warm-up densities must be in (0, 1]")

    def density_at(self, step: int) -> float:
        if self.steps == 0 or step >= self.steps or self.start <= self.final:
            return self.final
        return self.start * (self.final / self.start) ** (max(step, 0) / self.steps)


@dataclass(frozen=True)
class DelayedStart:
    """Compression starts at step ``steps`` (0-based); before that the gradient passes as is."""

    steps: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise CompressionConfigError(f"delayed start must be >= 0 steps, got {self.steps}")

    def active(self, step: int) -> bool:
        return step >= self.steps
