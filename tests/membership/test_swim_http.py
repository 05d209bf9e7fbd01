"""SwimMembership over real HTTP: one aiohttp server and one PeerClient per instance, loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import msgpack
import pytest
from aiohttp import web

from p2pnode.membership.base import MemberState
from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.net.client import PeerClient
from p2pnode.net.server import auth_middleware

A, D, L = MemberState.ALIVE, MemberState.DEAD, MemberState.LEFT
# LAN defaults, 4x faster, so the whole file takes a few seconds
FAST = SwimConfig.lan(probe_interval=0.25, probe_timeout=0.12, gossip_interval=0.05, push_pull_interval=5.0,
                      join_backoff=0.1)


class HttpNode:
    def __init__(self, name: str, secret: bytes | None, config: SwimConfig) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.client = PeerClient(secret)
        self.swim = SwimMembership(name, self.addr, self.client, config)
        self.app = web.Application(middlewares=[auth_middleware(secret)] if secret else [])
        self.swim.add_routes(self.app)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.1)
        self.task: asyncio.Task[None] | None = None

    async def start(self, seeds: list[str]) -> HttpNode:
        await self.runner.setup()
        await web.SockSite(self.runner, self.sock).start()
        self.task = asyncio.create_task(self.swim.run())
        await self.swim.join(seeds)
        return self

    async def kill(self) -> None:
        """Like SIGKILL: stop answering at once, say nothing."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        await self.runner.cleanup()
        await self.client.close()


@pytest.fixture
async def make_nodes() -> AsyncIterator:
    nodes: list[HttpNode] = []

    async def make(n: int, secret: bytes | None = None, config: SwimConfig = FAST) -> list[HttpNode]:
        out = []
        for i in range(n):
            node = HttpNode(f"node-{len(nodes)}", secret, config)
            seeds = [nodes[0].addr] if nodes else []
            nodes.append(node)
            out.append(await node.start(seeds))
        return out

    yield make
    for node in nodes:
        await node.kill()


async def wait_until(pred, timeout: float) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not pred():
        if loop.time() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)
    return loop.time() - start


def sees(observers, node_id: str, state: MemberState) -> bool:
    return all((m := o.swim.member(node_id)) is not None and m.state == state for o in observers)


@pytest.mark.timeout(60)
async def test_http_cluster_join_crash_leave(make_nodes) -> None:
    nodes = await make_nodes(3, secret=b"cluster-secret")
    await wait_until(lambda: all(len(n.swim.alive_peers()) == 2 for n in nodes), 3)
    # a fourth node with only one (non-seed) member's address
    d = HttpNode("node-late", b"cluster-secret", FAST)
    await d.start([nodes[2].addr])
    try:
        await wait_until(lambda: sees(nodes, "node-late", A), 2)
        await wait_until(lambda: len(d.swim.alive_peers()) == 3, 2)
        # crash one: every survivor marks it dead (n=4: floor 4 periods = 1 s here, at most 6 s)
        await nodes[1].kill()
        survivors = [nodes[0], nodes[2], d]
        took = await wait_until(lambda: sees(survivors, "node-1", D), 8)
        assert took > 0.5
        # leave: seen as left, quickly, by everyone
        await d.swim.leave()
        await wait_until(lambda: sees([nodes[0], nodes[2]], "node-late", L), 1)
        for n in survivors:
            assert n.swim.metrics.registry.get_sample_value("p2pnode_membership_messages_sent_total",
                                                            {"type": "ping"}) > 0
            assert n.swim.metrics.registry.get_sample_value("p2pnode_membership_sent_bytes_total") > 0
        probes = nodes[0].swim.metrics.registry.get_sample_value("p2pnode_membership_probes_total",
                                                                 {"result": "ack"})
        assert probes >= 1
    finally:
        await d.kill()


async def test_http_endpoints_reject_bad_input(make_nodes) -> None:
    (node,) = await make_nodes(1)
    client = PeerClient()
    try:
        garbage = await client.request("POST", node.addr, "/v1/membership/ping", b"\xc1\xc1", 1.0)
        assert garbage.status == 400 and b"undecodable" in garbage.body
        wrong = msgpack.packb({"v": 1, "t": "gossip", "f": "x", "u": []})
        mismatch = await client.request("POST", node.addr, "/v1/membership/ping", wrong, 1.0)
        assert mismatch.status == 400 and b"endpoint" in mismatch.body
        bad = msgpack.packb({"v": 1, "t": "gossip", "f": "x", "u": [{"t": "alive"}]})
        resp = await client.request("POST", node.addr, "/v1/membership/gossip", bad, 1.0)
        assert resp.status == 400 and b"missing field" in resp.body
        big = msgpack.packb({"v": 1, "t": "gossip", "f": "x", "u": [], "pad": "x" * 70_000})
        resp = await client.request("POST", node.addr, "/v1/membership/gossip", big, 1.0)
        assert resp.status == 413
        ok = await client.call(node.addr, "/v1/membership/gossip", {"v": 1, "t": "gossip", "f": "x", "u": []})
        assert ok["t"] == "ack" and ok["f"] == "node-0"
    finally:
        await client.close()


async def test_http_unsigned_requests_are_refused_when_a_secret_is_set(make_nodes) -> None:
    (node,) = await make_nodes(1, secret=b"s3cret")
    outsider = SwimMembership("outsider", "127.0.0.1:9", PeerClient(), FAST)
    try:
        assert not await outsider.push_pull(node.addr, join=True, timeout=1.0)
        assert node.swim.member("outsider") is None
    finally:
        await outsider.transport.client.close()  # type: ignore[attr-defined]
