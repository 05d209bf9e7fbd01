"""Pipe messages of the synchronous mode, added to the pipe protocol's registry (importing
this module is what lets ``pipe_protocol.decode`` read them; both processes import it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from p2pnode.pipe_protocol import Message

#: the phase of the models' mean after training (phases 0 and 1 are PowerSGD's), and its round
FINAL = 2
FINAL_ROUND = -2


@dataclass
class SyncContribute(Message):
    """worker -> daemon: this step's contribution to one phase of the all-reduce: phase 0 the
    P factors (and the small tensors whole), phase 1 the Q factors of the round phase 0 named.
    ``data``: the values (``exchange.sync_values``, sync/values.py)."""

    kind: ClassVar[str] = "sync-contribute"
    phase: int
    round: int
    data: bytes
    #: phase 0: seconds our step took since the last mean we applied (who is slow: lateness.py)
    took: float = 0.0


@dataclass
class SyncResult(Message):
    """daemon -> worker: the mean of a phase's contributions (as they were sent), the round it closed and
    how many nodes it averaged; ``included`` is False (and ``data`` may be empty) when ours was
    not among them: the reducer was unreachable, or we came too late (then ``replay`` may hold
    the rounds we missed)."""

    kind: ClassVar[str] = "sync-result"
    phase: int
    round: int
    data: bytes
    count: int
    included: bool
    #: phase 0 came too late: the rounds missed, [round, phase-0 mean, phase-1 mean] each, for
    #: the worker to step along instead of a step of its own
    replay: list[list[Any]] = field(default_factory=list)
    #: phase 0: the others' median step time, seconds (0.0: not known; ``exchange.sync_keep_pace``)
    pace: float = 0.0
    #: phase 0: the round's nodes are not the round before's: phase 1 without error feedback
    new_group: bool = False
