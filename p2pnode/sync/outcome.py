"""What the synchronous mode's reducer is given and answers: a contribution's bytes, checked
(``parse``: finite values, float16, int8 or int4 (``exchange.sync_values``), or float32 for the
models after training, as many as the round's other contributions have; else SyncRefused), and
the ``Outcome`` every contributor gets back, from its own reducer or over HTTP
(``sync/actor.py``). Daemon side, torch-free (numpy); ``sync/reducer.py`` holds the rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from p2pnode.sync.messages import FINAL
from p2pnode.sync.values import BadValues, decode, float32_view


class SyncRefused(ValueError):
    """A contribution that cannot be averaged (bad length, non-finite, malformed)."""


@dataclass
class Outcome:
    """What a contributor is answered: the phase's mean (bytes, as the contributions were), the round, how many
    nodes it averaged, and whether ours was one of them."""

    round: int
    data: bytes
    count: int
    included: bool
    #: our Q factors were older than the reducer's: we missed rounds, and our model their steps
    behind: bool = False
    #: the rounds we missed, (round, phase-0 mean, phase-1 mean) each, to step along in order
    #: instead of a step of our own: the model stays the others' (see ``Reducer._replay``)
    replay: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    #: the reducer stood down (its own node is slow): take the next lowest id for the rounds
    #: before this one (0: it did not)
    step_down: int = 0
    #: phase 0: the others' median step time, seconds (0.0: not known), the pace a slower node
    #: keeps by training on a part of its batch (``exchange.sync_keep_pace``)
    pace: float = 0.0
    #: phase 0: this round's nodes are not the round before's (a node came or went): every node
    #: leaves its error feedback out of phase 1 (``PowerSync.phase1``)
    new_group: bool = False


def wire_kind(phase: int, values: str) -> str:
    """``values`` (exchange.sync_values: float16, int8 or int4) for PowerSGD's factors; float32 for
    the models after training (the final model is not rounded)."""
    return "float32" if phase == FINAL else values


def parse(data: bytes, length: int | None = None, kind: str = "float16") -> np.ndarray:
    """``kind`` bytes (sync/values.py) as float32; SyncRefused unless well formed and finite
    (and ``length`` long)."""
    try:
        return float32_view(data, length) if kind == "float32" else decode(data, kind, length)
    except BadValues as exc:
        raise SyncRefused(str(exc)) from None
