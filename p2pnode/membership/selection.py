"""Which alive peer to exchange with this round.

- ``random``: uniform over alive peers (the paper).
- ``ring``: the next member after us in the sorted member list, so every node has one steady
  partner and models flow around the ring.
- ``exponential``: the time-varying one-peer exponential graph (Ying et al. 2021): in round r,
  node i talks to the member at offset 2^(r mod ceil(log2 n)) from itself in the sorted list of
  members (itself included). With n a power of two, log2 n rounds average exactly.

Pure functions of (member list, own id, round, rng): no state of their own, so they work the
same whatever membership protocol supplies the list.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from p2pnode.membership.base import Member

STRATEGIES = ("random", "ring", "exponential")


def _offset_peer(peers: Sequence[Member], self_id: str, offset: int) -> Member:
    ids = sorted([p.node_id for p in peers] + [self_id])
    me = ids.index(self_id)
    target = ids[(me + offset) % len(ids)]
    return next(p for p in peers if p.node_id == target)


def exponential_offset(round_no: int, n: int) -> int:
    """2^(r mod ceil(log2 n)): 1, 2, 4, ... up to below n, then again."""
    hops = max(1, math.ceil(math.log2(n)))
    return 2 ** (round_no % hops)


class PeerSelector:
    def __init__(self, strategy: str, self_id: str, rng: random.Random | None = None) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown peer selection {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.self_id = self_id
        self.rng = rng or random.Random()

    def choose(self, peers: Sequence[Member], round_no: int) -> Member:
        """One of ``peers`` (alive members other than us; must not be empty)."""
        if not peers:
            raise ValueError("no peers to choose from")
        if self.strategy == "random":
            return self.rng.choice(list(peers))
        if self.strategy == "ring":
            return _offset_peer(peers, self.self_id, 1)
        n = len(peers) + 1
        offset = exponential_offset(round_no, n) % n or 1
        return _offset_peer(peers, self.self_id, offset)
