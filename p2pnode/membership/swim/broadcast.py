"""The piggyback queue (memberlist's TransmitLimitedQueue).

Member updates wait here and ride on outgoing probe and gossip messages. Each is sent at most
``retransmit_mult * ceil(log10(n + 1))`` times, enough for epidemic spread to reach every
member with high probability, then dropped. The least-sent updates go first (newest first
among equals), within a byte budget per message. A new update about a node replaces any
queued one about the same node, since only the newest state matters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from p2pnode.membership.swim.messages import Update, encode_update


def update_size(u: Update) -> int:
    return len(msgpack.packb(encode_update(u), use_bin_type=True))


@dataclass
class _Queued:
    update: Update
    size: int
    order: int  # insertion order: higher is newer
    transmits: int = 0


class BroadcastQueue:
    def __init__(self, retransmit_limit: Callable[[], int]) -> None:
        """``retransmit_limit()`` gives the current limit (it grows with the cluster)."""
        self._limit = retransmit_limit
        self._items: dict[str, _Queued] = {}
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._items

    def queued(self, node_id: str) -> Update | None:
        item = self._items.get(node_id)
        return item.update if item else None

    def transmits(self, node_id: str) -> int | None:
        item = self._items.get(node_id)
        return item.transmits if item else None

    def enqueue(self, update: Update) -> None:
        """Queue an update, replacing any older one about the same node."""
        self._items[update.node] = _Queued(update, update_size(update), next(self._order))

    def drop(self, node_id: str) -> None:
        self._items.pop(node_id, None)

    def take(self, budget: int, overhead: int = 1, skip: Callable[[Update], bool] | None = None) -> list[Update]:
        """Updates for one message, at most ``budget`` bytes (``overhead`` added per update).

        Each returned update counts one transmission; those at the limit leave the queue.
        ``skip(update)`` true leaves an update out without counting it (the receiver has it).
        """
        if not self._items:
            return []
        limit = self._limit()
        out: list[Update] = []
        used = 0
        for item in sorted(self._items.values(), key=lambda q: (q.transmits, -q.order)):
            if skip is not None and skip(item.update):
                continue
            cost = item.size + overhead
            if used + cost > budget:
                continue
            used += cost
            out.append(item.update)
            item.transmits += 1
            if item.transmits >= limit:
                del self._items[item.update.node]
        return out
