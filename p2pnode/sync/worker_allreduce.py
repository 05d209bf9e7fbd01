"""The worker's side of the synchronous mode (``exchange.sync``): the trainer's hook that turns
a step's gradient into the network's mean, and what a node too late for a round does instead.

Each step's gradient goes through PowerSGD's two phases (``sync/worker_powersgd.py``) and the reducer
(``sync/reducer.py``), and every node steps along the same mean. A node whose phase 0 comes
after its round closed (a straggler: the reducer stops waiting for it, ``sync/lateness.py``) is
answered with the means of the rounds it missed; it steps along them as every node in them did,
so its model stays the others' to the bit; the gradient it computed meanwhile is dropped, as a
backup worker's is (Chen et al. 2016): offered to the next round instead, stale, it cost
accuracy. Whatever fails (no reducer in time, a malformed mean) leaves our own gradient: a local
step, never a wait beyond the bound.

Dropped, a straggler's gradients leave its data out of almost every round, which on label-skewed
shards leaves its classes barely learned. So a node keeps the others' pace instead, when asked
to (``exchange.sync_keep_pace``, off by default): each phase-0 answer carries the others' median
step time, and a node slower than that trains on a part of each batch, down to an eighth, sized
so that its step takes about as long as theirs (load-balanced synchronous SGD: Chen et al.
2020, *Semi-dynamic load balancing*). The network's mean still weighs every node's data as DDP
does, and its classes count in every round. By default the reducer waits instead for a slow node
whose label distribution is unlike the others' (``exchange.sync_wait_for_slow = "auto"``).
docs/ALGORITHMS.md, "Synchronous PowerSGD", has what each choice cost and gained.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from p2pnode.sync.messages import SyncResult
from p2pnode.sync.worker_powersgd import PowerSync
from p2pnode.worker.training import ShardTrainer

log = logging.getLogger("p2pnode.worker")

#: (phase, round, data, took) -> the phase's mean, or None when none came in time (the worker's
#: message loop: ``Worker.sync_phase``)
Phase = Callable[[int, int, bytes, float], SyncResult | None]

#: the smallest part of a batch a node slower than the others trains on
MIN_SHARE = 1.0 / 8
#: a node at a whole batch starts cutting it only when its step is this much over the pace
#: (machines of one kind differ by a few per cent from step to step)
SLACK = 1.15
#: how far one step moves the share towards the pace (the step times it reads are averages of
#: about 5 steps: a larger move would overshoot)
GAIN = 0.25
#: weight of the newest step time in our moving average of it
ALPHA = 0.2


class AllReduce:
    def __init__(self, trainer: ShardTrainer, sync: PowerSync, phase: Phase, keep_pace: bool = False) -> None:
        self.trainer = trainer
        self.sync = sync
        self.phase = phase
        self.keep_pace = keep_pace
        self.synced_at = 0.0  #: when the last all-reduce's answer came (our step's time runs from it)
        self.took = 0.0  #: our moving average of our step time, seconds
        self._told = 1.0  #: the share last logged

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
            self.pace(first.pace, took)
            if not first.included:
                if first.replay:
                    t.drop_step()  # the rounds we missed replace this step: its gradient is dropped
                    self.replay(first.replay)
                    return False
                if first.data and first.round >= 0:  # our Q fell behind: the current ones, for the next step
                    sync.resync(first.data, first.round)
                return None
            second = self.phase(1, first.round, sync.phase1(first.data, clean=first.new_group), 0.0)
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

    def pace(self, pace: float, took: float) -> None:
        """Size our next batch so that our step takes about ``pace`` seconds, the others' median
        (0: not known): a step slower than that holds every round up or misses it."""
        if not self.keep_pace or not (pace > 0 and took > 0):
            return
        self.took = took if self.took == 0 else (1 - ALPHA) * self.took + ALPHA * took
        t = self.trainer
        if t.batch_share >= 1.0 and self.took <= SLACK * pace:
            return
        t.batch_share = min(1.0, max(MIN_SHARE, t.batch_share * (pace / self.took) ** GAIN))
        if abs(t.batch_share - self._told) >= 0.1 or (t.batch_share == 1.0) != (self._told == 1.0):
            self._told = t.batch_share
            log.info("keeping the others' pace (%.0f ms a step, ours %.0f ms): training on %.0f%% of each batch",
                     1000 * pace, 1000 * self.took, 100 * t.batch_share)

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
