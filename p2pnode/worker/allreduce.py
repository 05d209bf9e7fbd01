"""The worker's side of the synchronous mode (``exchange.sync``): the trainer's hook that turns
a step's gradient into the network's mean, and what a node too late for a round does instead.

Each step's gradient goes through PowerSGD's two phases (``sync/powersgd.py``) and the reducer
(``sync/reducer.py``), and every node steps along the same mean. A node whose phase 0 comes
after its round closed (a straggler: the reducer stops waiting for it, ``sync/lateness.py``) is
answered with the means of the rounds it missed; it steps along them as every node in them did,
so its model stays the others' to the bit. Its own gradient is not thrown away: it is offered
again to the next round, with that round's Q factors, stale by the rounds just replayed (at
most ``MAX_STALE``), as bounded-staleness SGD does (Ho et al. 2013, *More Effective Distributed
ML via a Stale Synchronous Parallel Parameter Server*). In time for that round, the node steps
with everyone and its data counts; late again, it replays again. Whatever fails (no reducer in
time, a malformed mean) before any replay leaves our own gradient: a local step, never a wait
beyond the bound.
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

#: (phase, round, data, took, stale) -> the phase's mean, or None when none came in time (the
#: worker's message loop: ``Worker.sync_phase``)
Phase = Callable[[int, int, bytes, float, int], SyncResult | None]

#: the most rounds a late gradient may be behind and still be offered to the next round (more:
#: it is dropped, as a backup worker's is)
MAX_STALE = 4


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
        replayed = 0
        offered = grads
        try:
            first = self.phase(0, sync.q_round, sync.phase0(grads), took, 0)
            while first is not None and not first.included and first.replay:
                if not replayed:
                    offered = {n: g.clone() for n, g in grads.items()}  # stepping along overwrites .grad
                    t.drop_step()
                taken = self.replay(first.replay)
                replayed += taken
                if taken < len(first.replay) or replayed > MAX_STALE or t.done:
                    # our gradient is dropped: too stale, the replay cut short, or the rounds
                    # replayed were the last (a step more would be past the end)
                    return False
                # our gradient, stale by the rounds just taken, to the next round (took 0: not a step time)
                first = self.phase(0, sync.q_round, sync.phase0(offered), 0.0, replayed)
            if first is None or not first.included:
                if first is not None and not replayed and first.data and first.round >= 0:
                    sync.resync(first.data, first.round)  # our Q fell behind: the current ones, for the next step
                return False if replayed else None
            second = self.phase(1, first.round, sync.phase1(first.data), 0.0, 0)
            if second is None or not second.data:
                return False if replayed else None
            mean = sync.finish(second.data, second.round, second.included)
        except (KeyError, ValueError) as exc:
            log.warning("all-reduce result refused (%s): %s", exc, "no step of our own" if replayed else "a local step")
            return False if replayed else None
        if replayed:
            t.resume_step()  # the step dropped for the replay is taken after all, with the others'
        with torch.no_grad():
            for n, g in grads.items():
                g.copy_(mean[n].view_as(g))
        return True

    def replay(self, rounds: list[list[Any]]) -> int:
        """Step along the rounds we missed, as every node in them did: our model stays theirs
        (a straggler keeps up without holding the others back). Returns the rounds taken; a
        malformed one stops the replay where it is (0: none taken)."""
        taken = 0
        with torch.no_grad():
            for rnd, mean0, mean1 in rounds:
                try:
                    grads = self.sync.rebuild(bytes(mean0), bytes(mean1), int(rnd))
                except (KeyError, ValueError, TypeError) as exc:
                    log.warning("replay of round %s refused (%s)", rnd, exc)
                    break
                self.trainer.step_along(grads)
                taken += 1
        return taken
