"""The worker's side of the synchronous mode (``exchange.sync``): the trainer's hook that turns
a step's gradient into the network's mean, and what a node too late for a round does instead.

Each step's gradient goes through PowerSGD's two phases (``sync/powersgd.py``) and the reducer
(``sync/reducer.py``), and every node steps along the same mean. A node whose phase 0 comes
after its round closed (a straggler: the reducer stops waiting for it, ``sync/lateness.py``) is
answered with the means of the rounds it missed; it steps along them as every node in them did,
so its model stays the others' to the bit; the gradient it computed meanwhile is dropped, as a
backup worker's is (Chen et al. 2016). Offering it to the next round instead, stale by the
rounds replayed, was measured and lost 0.6–0.8 pt (docs/BENCHMARKS.md, "Scenarios, thirteenth
round"). Whatever fails (no reducer in time, a malformed mean) leaves our own gradient: a local
step, never a wait beyond the bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from p2pnode.sync.messages import SyncResult
from p2pnode.sync.powersgd import PowerSync
from p2pnode.worker.training import ShardTrainer

log = logging.getLogger("p2pnode.worker")

#: (phase, round, data, took) -> the phase's mean, or None when none came in time (the worker's
#: message loop: ``Worker.sync_phase``)
Phase = Callable[[int, int, bytes, float], SyncResult | None]


class AllReduce:
    def __init__(self, trainer: ShardTrainer, sync: PowerSync, phase: Phase) -> None:
        self.trainer = trainer
        self.sync = sync
        self.phase = phase
        self.synced_at = 0.0  #: when the last all-reduce's answer came (our step's time runs from it)

    def __call__(self) -> bool | None:
        """The trainer's reduce hook (``ShardTrainer.train_step``): True, the gradients are the
        network's mean; False, the rounds we missed were stepped along and there is no step of
        our own to take; None, the all-reduce failed and our own gradient stands."""
        try:
            return self._reduce()
        finally:
            self.synced_at = time.monotonic()  # our next step's time runs from the mean (or replay) we took

    def _reduce(self) -> bool | None:
        sync, t = self.sync, self.trainer
        grads = {n: p.grad for n, p in t.model.named_parameters() if p.grad is not None}
        took = time.monotonic() - self.synced_at if self.synced_at else 0.0
        try:
            first = self.phase(0, sync.q_round, sync.phase0(grads), took)
            if first is None:
                return None
            if not first.included:
                if first.replay:
                    t.drop_step()  # the rounds we missed replace this step: its gradient is dropped
                    self.replay(first.replay)
                    return False
                if first.data and first.round >= 0:  # our Q fell behind: the current ones, for the next step
                    sync.resync(first.data, first.round)
                return None
            second = self.phase(1, first.round, sync.phase1(first.data), 0.0)
            if second is None or not second.data:
                return None
            mean = sync.finish(second.data, second.round, second.included)
        except (KeyError, ValueError) as exc:
            log.warning("all-reduce result refused (%s): a local step", exc)
            return None
        with torch.no_grad():
            for n, g in grads.items():
                g.copy_(mean[n].view_as(g))
        return True

    def replay(self, rounds: list[list[Any]]) -> None:
        """Step along the rounds we missed, as every node in them did: our model stays theirs
        (a straggler keeps up without holding the others back). A malformed round stops the
        replay where it is, and so does the end of training (a node whose step count is a
        local step ahead of its rounds would otherwise step past it; the models' mean after
        training evens out the model)."""
        with torch.no_grad():
            for rnd, mean0, mean1 in rounds:
                if self.trainer.done:
                    break
                try:
                    grads = self.sync.rebuild(bytes(mean0), bytes(mean1), int(rnd))
                except (KeyError, ValueError, TypeError) as exc:
                    log.warning("replay of round %s refused (%s)", rnd, exc)
                    break
                self.trainer.step_along(grads)
