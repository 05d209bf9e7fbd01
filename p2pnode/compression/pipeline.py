"""The gradient path: memory -> compressor -> what the optimizer steps with.

``GradientPipeline("mean-threshold").apply(name, grad)`` returns
``decompress(compress(grad + memory))``, updates the memory, and adds the payload's real wire
size to ``last_payload_bytes``. Call ``begin_step()`` once per optimizer step (it resets the
byte count and advances the schedules). Everything the pipeline carries across steps is in
``state_dict()`` (tensors, numbers, strings, dicts), loadable with ``weights_only=True``.
"""

from __future__ import annotations

from typing import Any

import torch

from p2pnode.compression.base import CompressionConfigError, payload_bytes
from p2pnode.compression.memory import make_memory
from p2pnode.compression.quantize import Identity
from p2pnode.compression.registry import build
from p2pnode.compression.schedule import DelayedStart, WarmupDensity

__all__ = ["GradientPipeline"]


class GradientPipeline:
    """Per-parameter compression of gradients with optional memory and schedules.

    memory: "none", "residual" (error feedback) or "dgc" (momentum correction + momentum
    factor masking; the optimizer must then run without momentum; sparsifiers only).
    warmup_steps / warmup_start: DGC density warm-up for compressors with a ``density``.
    delay_steps: steps before compression starts (gradients pass unchanged before).
    """

    def __init__(self, spec: str, memory: str = "none", *, momentum: float = 0.9,
                 warmup_steps: int = 0, warmup_start: float = 0.25, delay_steps: int = 0) -> None:
        self.spec = spec
        self.compressor = build(spec)
        self.memory_kind = memory
        self.memory = make_memory(memory, momentum)
        if memory == "dgc" and not self.compressor.traits.sparse and not isinstance(self.compressor, Identity):
            raise CompressionConfigError(
                f"memory 'dgc' needs a sparsifier; {self.compressor.name!r} is dense "
                "(use memory 'residual')"
            )
        self.warmup: WarmupDensity | None = None
        if warmup_steps > 0:
            if not hasattr(self.compressor, "density"):
                raise CompressionConfigError(f"{self.compressor.name!r} has no density to warm up")
            self.warmup = WarmupDensity(self.compressor.density, warmup_steps, warmup_start)
        self.delay = DelayedStart(delay_steps)
        self._identity = isinstance(self.compressor, Identity) and memory == "none"
        self.step = -1  # begin_step() makes it 0
        self.last_payload_bytes = 0
        self._dense_bytes: dict[tuple[tuple[int, ...], torch.dtype], int] = {}
        self._sync_schedule()

    def _sync_schedule(self) -> None:
        step = max(self.step, 0)
        if self.warmup is not None:
            # the warm-up starts when compression does (after a delayed start)
            warm = step - self.delay.steps
            self.compressor.density = self.warmup.density_at(warm)  # type: ignore[attr-defined]
        self._passthrough = self._identity or not self.delay.active(step)

    def begin_step(self) -> None:
        """Start an optimizer step: reset ``last_payload_bytes``, advance the schedules."""
        self.step += 1
        self.last_payload_bytes = 0
        self._sync_schedule()

    def _dense_size(self, grad: torch.Tensor) -> int:
        key = (tuple(grad.shape), grad.dtype)
        size = self._dense_bytes.get(key)
        if size is None:
            size = self._dense_bytes[key] = payload_bytes({"x": grad.reshape(-1)})
        return size

    def apply(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """The tensor the optimizer should step with for parameter ``name``."""
        if self._passthrough:
            self.last_payload_bytes += self._dense_size(grad)
            return grad
        comp = self.compressor
        x = self.memory.compensate(name, grad)
        out, nbytes = comp.roundtrip(x, name)
        self.last_payload_bytes += nbytes
        self.memory.update(name, x, out)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "memory_kind": self.memory_kind,
            "step": self.step,
            "memory": self.memory.state_dict(),
            "compressor": self.compressor.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("memory_kind", self.memory_kind) != self.memory_kind:
            raise CompressionConfigError(
                f"checkpoint has memory {state.get('memory_kind')!r}, pipeline {self.memory_kind!r}"
            )
        self.step = int(state.get("step", -1))
        self.memory.load_state_dict(state.get("memory", {}))
        self.compressor.load_state_dict(state.get("compressor", {}))
        self._sync_schedule()
