"""Whose model a node that is told it is behind takes whole (p2pnode/sync/actor.py,
``SyncActor._catch_up``): the reducer's that told it, not the lowest id's. When a reducer dies
mid-round, the survivors that missed its last answer are behind at the stand-in; the lowest id
was still the dead reducer (membership had not called it dead yet), every try failed, and the
ten seconds between tries left those nodes out of 67 rounds (docs/archive/BENCHMARKS-history.md, the runs of
2026-11-26 11:19). Only the choice is under test here: ``_adopt`` records it instead of fetching."""

from __future__ import annotations

import asyncio
import time

from p2pnode.config import Config
from p2pnode.membership.base import Member
from p2pnode.sync.actor import CATCH_UP_EVERY, SyncActor


def actor(me: str, peers: list[str]) -> tuple[SyncActor, list[str]]:
    members = [Member(p, f"127.0.0.1:{7000 + i}") for i, p in enumerate(peers)]
    a = SyncActor(Config(), None, None, me, lambda: members, lambda: 0, lambda request: None)  # type: ignore[arg-type]
    taken: list[str] = []

    async def adopt(rid: str, again: bool = True) -> None:
        taken.append(rid)

    a._adopt = adopt  # type: ignore[method-assign]
    return a, taken


def test_a_node_behind_takes_the_model_of_the_reducer_that_told_it_not_the_lowest_id() -> None:
    async def go() -> None:
        a, taken = actor("d", ["a", "b", "c"])  # "a" died as reducer; "b" stands in
        a.current = ("b", "127.0.0.1:7001")
        a._catch_up()
        await asyncio.sleep(0)
        assert taken == ["b"]
    asyncio.run(go())


def test_a_reducer_behind_takes_the_next_node_it_can_reach() -> None:
    async def go() -> None:
        a, taken = actor("b", ["a", "c", "d"])
        a.current = ("b", "")  # we reduce (the restarted lowest id came back behind the others)
        a.unreachable["a"] = time.monotonic() + 5  # a reducer found unreachable a moment ago
        a._catch_up()
        await asyncio.sleep(0)
        assert taken == ["c"]
        a._catch_up()  # within CATCH_UP_EVERY of a try: no second one
        await asyncio.sleep(0)
        assert taken == ["c"] and CATCH_UP_EVERY > 1
    asyncio.run(go())
