"""Hundreds of real SWIM instances in one process, on a simulated network and a virtual clock.

Only two things differ from the daemon: the transport (``SimTransport`` hands the encoded
bytes to the destination's ``Transport.handle_bytes``, the same codec HTTP uses, after a
delay, unless the message is lost, partitioned away, or the destination is down) and the
clock (``VirtualClockLoop`` is an asyncio loop whose time jumps to the next timer whenever
nothing is runnable, so a minute of protocol time costs only the CPU the protocol uses).
Every timer, timeout and sleep in the protocol code runs unchanged on that clock.

    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        runner.run(main())      # main() builds a SimCluster, starts nodes, crashes some ...
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from p2pnode.membership.base import MemberState
from p2pnode.config.swim import SwimConfig
from p2pnode.membership.swim.messages import MessageError
from p2pnode.membership.swim.membership import SwimMembership
from p2pnode.membership.swim.transport import Transport, TransportError

T = TypeVar("T")


# --- virtual time ----------------------------------------------------------------------------


class _JumpSelector(selectors.BaseSelector):
    """Polls real I/O without blocking; when nothing is ready, advances the loop's clock by
    the timeout the loop asked to sleep, i.e. straight to its next timer."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only real I/O (a thread, a signal) can wake us
            return self._real.select(None)
        self._loop.advance(timeout)
        return []

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, starting at 0: idle time costs nothing."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._virtual_now += seconds


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to completion on a fresh virtual-clock loop."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main())  # type: ignore[arg-type]


# --- the network -----------------------------------------------------------------------------


class SimNetwork:
    """Delivers requests and replies between ``SimTransport`` endpoints.

    ``loss`` is the chance that any one message (request or reply) is lost; one-way delay is
    ``delay`` plus uniform jitter. A *down* address refuses connections at once (a crashed
    process); a *paused* one, or one across a partition, never answers (timeouts), like a
    SIGSTOPped process or a cut link.
    """

    def __init__(self, rng: random.Random | None = None, loss: float = 0.0, delay: float = 0.0005,
                 jitter: float = 0.0005) -> None:
        self.rng = rng or random.Random(0)
        self.loss = loss
        self.delay = delay
        self.jitter = jitter
        self.endpoints: dict[str, SimTransport] = {}
        self.down: set[str] = set()
        self.paused: set[str] = set()
        self._group: dict[str, int] = {}
        self.requests = 0
        self.lost = 0

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut the network into these groups of addresses (addresses in no group see all)."""
        self._group = {addr: i for i, group in enumerate(groups) for addr in group}

    def heal(self) -> None:
        self._group = {}

    def reachable(self, src: str, dst: str) -> bool:
        g1, g2 = self._group.get(src), self._group.get(dst)
        return g1 is None or g2 is None or g1 == g2

    def _gets_through(self, src: str, dst: str) -> bool:
        if dst in self.paused or src in self.paused or not self.reachable(src, dst):
            return False
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return False
        return True

    async def _hop(self) -> None:
        d = self.delay + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
        if d > 0:
            await asyncio.sleep(d)

    async def deliver(self, src: str, dst: str, msg_type: str, data: bytes, timeout: float) -> bytes:
        self.requests += 1
        try:
            async with asyncio.timeout(timeout):
                through = self._gets_through(src, dst)
                await self._hop()
                endpoint = self.endpoints.get(dst)
                if endpoint is None or dst in self.down:
                    raise TransportError(f"{dst}: connection refused")
                if not through or dst in self.paused:
                    await asyncio.sleep(timeout * 2)  # the timeout fires first
                try:
                    reply = await endpoint.handle_bytes(msg_type, data)
                except MessageError as exc:
                    raise TransportError(f"{dst}: HTTP 400: {exc}") from None
                if not self._gets_through(dst, src) or dst in self.down:
                    await asyncio.sleep(timeout * 2)
                await self._hop()
                return reply
        except TimeoutError:
            raise TransportError(f"{dst}: no answer within {timeout:g} s") from None


class SimTransport(Transport):
    def __init__(self, net: SimNetwork, addr: str) -> None:
        super().__init__()
        self.net = net
        self.addr = addr
        net.endpoints[addr] = self

    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        data = self.encode_request(msg)
        reply = await self.net.deliver(self.addr, addr, msg["t"], data, timeout)
        return self.decode_reply(msg["t"], reply)


# --- a cluster -------------------------------------------------------------------------------


class SimCluster:
    """Many SwimMembership instances on one SimNetwork; call from a VirtualClockLoop."""

    def __init__(self, config: SwimConfig | None = None, seed: int = 0, loss: float = 0.0, delay: float = 0.0005,
                 jitter: float = 0.0005) -> None:
        self.config = config or SwimConfig.lan()
        self.rng = random.Random(seed)
        self.net = SimNetwork(random.Random(self.rng.getrandbits(64)), loss, delay, jitter)
        self.nodes: dict[str, SwimMembership] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._count = 0

    @staticmethod
    def addr_of(index: int) -> str:
        return f"n{index:04d}.sim:7070"

    def add(self, node_id: str | None = None, incarnation: int = 0, config: SwimConfig | None = None
            ) -> SwimMembership:
        """Create (not start) a node; a node id seen before gets a new address (a new life)."""
        index = self._count
        self._count += 1
        node_id = node_id or f"n{index:04d}"
        addr = self.addr_of(index)
        node = SwimMembership(node_id, addr, None, config or self.config, incarnation,
                              transport=SimTransport(self.net, addr), rng=random.Random(self.rng.getrandbits(64)))
        self.nodes[node_id] = node
        return node

    def start(self, node: SwimMembership) -> None:
        self.net.down.discard(node.addr)
        self.tasks[node.node_id] = asyncio.get_running_loop().create_task(node.run(), name=f"swim-{node.node_id}")

    async def spawn(self, n: int, seeds: int = 1) -> list[SwimMembership]:
        """Start n nodes; the first ``seeds`` of the cluster are every later node's seeds."""
        out = []
        for _ in range(n):
            node = self.add()
            self.start(node)
            seed_addrs = [m.addr for m in list(self.nodes.values())[:seeds] if m is not node]
            await node.join(seed_addrs)
            out.append(node)
        return out

    def crash(self, node_id: str) -> None:
        """SIGKILL: the process is gone and its port refuses connections."""
        node = self.nodes[node_id]
        self.net.down.add(node.addr)
        task = self.tasks.pop(node_id, None)
        if task is not None:
            task.cancel()

    def pause(self, node_id: str) -> None:
        """SIGSTOP-like: it neither runs nor answers until resume()."""
        self.net.paused.add(self.nodes[node_id].addr)
        task = self.tasks.pop(node_id, None)
        if task is not None:
            task.cancel()

    def resume(self, node_id: str) -> None:
        node = self.nodes[node_id]
        self.net.paused.discard(node.addr)
        self.start(node)

    async def leave(self, node_id: str) -> None:
        node = self.nodes[node_id]
        await node.leave()
        self.crash(node_id)

    def running(self) -> list[SwimMembership]:
        return [self.nodes[i] for i in self.tasks]

    def state_seen(self, observer: SwimMembership, node_id: str) -> MemberState | None:
        m = observer.table.get(node_id)
        return m.state if m is not None else None

    def all_see(self, node_id: str, *states: MemberState, observers: Iterable[SwimMembership] | None = None) -> bool:
        obs = list(observers) if observers is not None else [n for n in self.running() if n.node_id != node_id]
        return all(self.state_seen(o, node_id) in states for o in obs)

    def converged(self) -> bool:
        """Every running node sees every running node alive."""
        running = self.running()
        return all(self.state_seen(o, n.node_id) == MemberState.ALIVE for o in running for n in running)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> float | None:
        """Virtual seconds until ``predicate()`` holds (checked every ``step``), or None."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() - start <= timeout:
            if predicate():
                return loop.time() - start
            await asyncio.sleep(step)
        return None

    def counters(self) -> dict[str, int]:
        """Messages and bytes sent, summed over every node (requests and replies)."""
        out = {"messages": 0, "bytes": 0}
        for node in self.nodes.values():
            out["messages"] += node.metrics.sent_total
            out["bytes"] += node.metrics.sent_bytes_total
        return out

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        self.tasks.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
