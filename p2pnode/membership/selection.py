"""Which alive peer to exchange with this round.

- ``random``: uniform over alive peers (the paper).
- ``ring``: the next member after us in the sorted member list, so every node has one steady
  partner and models flow around the ring.
- ``exponential``: the time-varying one-peer exponential graph (Ying et al., "Exponential graph
  is provably efficient for decentralized deep training", NeurIPS 2021): in round r, node i
  talks to the member at offset 2^(r mod ceil(log2 n)) from itself in the sorted list of
  members (itself included). With n a power of two, log2 n rounds of pairwise averaging along
  those edges average exactly: every node ends with the global mean.

``choose_peer`` is a pure function of (member ids, own id, round, rng): no state of its own, so
it works the same whatever membership protocol supplies the list, and every node computes the
same graph from the same view without coordination. ``PeerSelector`` binds a strategy, the
node's id and an RNG, and maps the choice back to a ``Member``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from p2pnode.membership.base import Member

STRATEGIES = ("random", "ring", "exponential")


def exponential_offset(round_no: int, n: int) -> int:
    """2^(r mod ceil(log2 n)): 1, 2, 4, ... up to below n, then again."""
    hops = max(1, math.ceil(math.log2(max(2, n))))
    return 2 ** (round_no % hops)


def _check(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown peer selection {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def choose_peer(strategy: str, members: Sequence[str], self_id: str, round_no: int,
                rng: random.Random) -> str | None:
    """The id to talk to in round ``round_no``; ``members`` may or may not include ``self_id``.

    None when there is nobody else.
    """
    _check(strategy)
    ids = sorted(set(members) | {self_id})
    n = len(ids)
    if n < 2:
        return None
    if strategy == "random":
        return rng.choice([m for m in ids if m != self_id])
    me = ids.index(self_id)
    offset = 1 if strategy == "ring" else exponential_offset(round_no, n) % n or 1
    return ids[(me + offset) % n]


class PeerSelector:
    def __init__(self, strategy: str, self_id: str, rng: random.Random | None = None) -> None:
        _check(strategy)
        self.strategy = strategy
        self.self_id = self_id
        self.rng = rng or random.Random()

    def choose(self, peers: Sequence[Member], round_no: int) -> Member:
        """One of ``peers`` (alive members other than us; must not be empty)."""
        by_id = {p.node_id: p for p in peers if p.node_id != self.self_id}
        if not by_id:
            raise ValueError("no peers to choose from")
        chosen = choose_peer(self.strategy, sorted(by_id), self.self_id, round_no, self.rng)
        assert chosen is not None
        return by_id[chosen]

    def choose_many(self, peers: Sequence[Member], round_no: int, k: int) -> list[Member]:
        """Up to ``k`` distinct peers for rounds ``round_no``, ``round_no + 1``, ...: with the
        exponential graph, k edges of the graph at once (offsets 1, 2, 4, ...); with ``ring``
        the next k members; any shortfall filled at random."""
        by_id = {p.node_id: p for p in peers if p.node_id != self.self_id}
        chosen: list[Member] = []
        for r in range(round_no, round_no + 2 * k + 2):
            if len(chosen) >= min(k, len(by_id)):
                break
            rest = [m for m in by_id.values() if m not in chosen]
            if self.strategy == "ring":  # the member after the last one taken
                ids = sorted([*(m.node_id for m in rest), self.self_id])
                me = ids.index(self.self_id)
                chosen.append(by_id[ids[(me + 1) % len(ids)]])
                continue
            pick = self.choose(peers, r)
            if pick not in chosen:
                chosen.append(pick)
        rest = [m for m in by_id.values() if m not in chosen]
        self.rng.shuffle(rest)
        return chosen + rest[:max(0, k - len(chosen))]
