"""Simple discovery: join through a seed, then swap member lists with one member per interval.

Enough for a small, healthy cluster and the reference SWIM is measured against. A member is
marked dead after ``fail_threshold`` failed contacts in a row (list swaps or model exchanges)
and alive again as soon as it answers; dead members are still tried now and then. A node that
leaves on purpose tells everyone, and is listed as *left* until it comes back with a higher
incarnation.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from aiohttp import web

from p2pnode.membership.base import EventKind, JoinError, Member, Membership, MemberState
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.net.server import msgpack_handler

log = logging.getLogger("p2pnode.membership")

MAX_MEMBERS = 4096


def _parse_members(reply: dict[str, Any]) -> list[tuple[str, str, str, int]]:
    raw = reply.get("members")
    if not isinstance(raw, list) or len(raw) > MAX_MEMBERS:
        raise PeerError("member list missing or too long")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise PeerError("member entry is not a map")
        node_id, addr, state, inc = item.get("node_id"), item.get("addr"), item.get("state"), item.get("incarnation")
        if not (isinstance(node_id, str) and isinstance(addr, str) and isinstance(state, str)
                and isinstance(inc, int)
                and state in MemberState.__members__.values() and 0 < len(node_id) <= 64 and len(addr) <= 300):
            raise PeerError(f"bad member entry {item!r:.200}")
        out.append((node_id, addr, state, inc))
    return out


class SimpleMembership(Membership):
    def __init__(self, node_id: str, addr: str, client: PeerClient, incarnation: int = 0,
                 interval: float = 1.0, timeout: float = 1.0, fail_threshold: int = 3) -> None:
        super().__init__()
        self.me = Member(node_id, addr, MemberState.ALIVE, incarnation, time.monotonic())
        self.client = client
        self.interval = interval
        self.timeout = timeout
        self.fail_threshold = fail_threshold
        self._members: dict[str, Member] = {node_id: self.me}
        self._failures: dict[str, int] = {}

    # --- reads ----------------------------------------------------------------------------

    def alive_peers(self) -> list[Member]:
        return [m for m in self._members.values() if m is not self.me and m.state == MemberState.ALIVE]

    def members(self) -> list[Member]:
        return sorted(self._members.values(), key=lambda m: m.node_id)

    def _listing(self) -> dict[str, Any]:
        return {"members": [m.to_json() for m in self._members.values()
                            if m.state in (MemberState.ALIVE, MemberState.LEFT)]}

    # --- state changes --------------------------------------------------------------------

    def _set_state(self, member: Member, state: MemberState) -> None:
        if member.state == state:
            return
        before = member.state
        member.state, member.changed_at = state, time.monotonic()
        kind = {MemberState.ALIVE: EventKind.RECOVER if before == MemberState.DEAD else EventKind.JOIN,
                MemberState.DEAD: EventKind.FAIL, MemberState.LEFT: EventKind.LEAVE}.get(state)
        if kind is not None:
            self._emit(kind, member)
        log.info("member %s (%s): %s -> %s", member.node_id, member.addr, before, state)

    def _heard_from(self, node_id: str, addr: str, incarnation: int) -> None:
        """Direct contact: the node is alive at this address now."""
        member = self._members.get(node_id)
        if member is None:
            member = self._members[node_id] = Member(node_id, addr, MemberState.DEAD, incarnation, time.monotonic())
        if member.state == MemberState.LEFT and incarnation <= member.incarnation:
            return  # it said goodbye in this life; only a restart (higher incarnation) brings it back
        member.addr, member.incarnation = addr, max(member.incarnation, incarnation)
        self._failures[node_id] = 0
        self._set_state(member, MemberState.ALIVE)

    def _merge(self, entries: list[tuple[str, str, str, int]]) -> None:
        """Take news of others: new members, and leaves of the life we know or a later one."""
        for node_id, addr, state, inc in entries:
            if node_id == self.me.node_id:
                continue
            member = self._members.get(node_id)
            if member is None:
                member = self._members[node_id] = Member(node_id, addr, MemberState.DEAD, inc, time.monotonic())
                self._set_state(member, MemberState(state))
            elif inc > member.incarnation:
                member.addr, member.incarnation = addr, inc
                self._failures[node_id] = 0
                self._set_state(member, MemberState(state))
            elif inc == member.incarnation and state == MemberState.LEFT:
                self._set_state(member, MemberState.LEFT)

    def _contact_failed(self, node_id: str) -> None:
        member = self._members.get(node_id)
        if member is None or member.state != MemberState.ALIVE:
            return
        self._failures[node_id] = self._failures.get(node_id, 0) + 1
        if self._failures[node_id] >= self.fail_threshold:
            self._set_state(member, MemberState.DEAD)

    def report_exchange(self, node_id: str, ok: bool) -> None:
        member = self._members.get(node_id)
        if member is None:
            return
        if ok:
            self._heard_from(node_id, member.addr, member.incarnation)
        else:
            self._contact_failed(node_id)

    # --- protocol -------------------------------------------------------------------------

    def _hello(self) -> dict[str, Any]:
        return {"node_id": self.me.node_id, "addr": self.me.addr, "incarnation": self.me.incarnation}

    def _sender(self, msg: dict[str, Any]) -> tuple[str, str, int]:
        node_id, addr, inc = msg.get("node_id"), msg.get("addr"), msg.get("incarnation")
        if not (isinstance(node_id, str) and isinstance(addr, str) and isinstance(inc, int)
                and 0 < len(node_id) <= 64 and len(addr) <= 300):
            raise ValueError("expected node_id, addr and incarnation")
        return node_id, addr, inc

    async def _on_sync(self, msg: dict[str, Any]) -> dict[str, Any]:
        node_id, addr, inc = self._sender(msg)
        if node_id != self.me.node_id:
            self._heard_from(node_id, addr, inc)
        if "members" in msg:
            try:
                self._merge(_parse_members(msg))
            except PeerError as exc:
                raise ValueError(str(exc)) from None
        return self._listing()

    async def _on_leave(self, msg: dict[str, Any]) -> dict[str, Any]:
        node_id, addr, inc = self._sender(msg)
        member = self._members.get(node_id)
        if member is not None and inc >= member.incarnation:
            member.incarnation = inc
            self._set_state(member, MemberState.LEFT)
        return {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/membership/join", msgpack_handler(self._on_sync))
        app.router.add_post("/v1/membership/sync", msgpack_handler(self._on_sync))
        app.router.add_post("/v1/membership/leave", msgpack_handler(self._on_leave))

    async def _sync_with(self, member: Member, path: str = "/v1/membership/sync") -> bool:
        try:
            reply = await self.client.call(member.addr, path, {**self._hello(), **self._listing()}, self.timeout)
            entries = _parse_members(reply)
        except PeerError as exc:
            log.debug("sync with %s failed: %s", member.addr, exc)
            self._contact_failed(member.node_id)
            return False
        self._heard_from(member.node_id, member.addr, member.incarnation)
        self._merge(entries)
        return True

    async def join(self, seeds: list[str]) -> None:
        delay = 0.2
        for attempt in range(5):
            for seed in seeds:
                try:
                    reply = await self.client.call(seed, "/v1/membership/join", self._hello(), self.timeout)
                    self._merge(_parse_members(reply))
                    log.info("joined through %s: %d members", seed, len(self._members))
                    return
                except PeerError as exc:
                    log.warning("seed %s did not answer: %s", seed, exc)
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)
        raise JoinError(f"no seed answered: {', '.join(seeds)}")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval * random.uniform(0.8, 1.2))
            others = [m for m in self._members.values() if m is not self.me and m.state != MemberState.LEFT]
            if not others:
                continue
            alive = [m for m in others if m.state == MemberState.ALIVE]
            # Mostly the living; one time in four someone we think dead, to see it come back.
            pool = alive if alive and (random.random() < 0.75 or len(alive) == len(others)) else others
            await self._sync_with(random.choice(pool))

    async def leave(self) -> None:
        self.me.state = MemberState.LEFT
        peers = [m for m in self._members.values() if m is not self.me and m.state == MemberState.ALIVE]
        await asyncio.gather(*(self._tell_leave(m) for m in peers))

    async def _tell_leave(self, member: Member) -> None:
        try:
            await self.client.call(member.addr, "/v1/membership/leave", self._hello(), min(self.timeout, 1.0))
        except PeerError:
            pass  # it will find out on its own
