"""A stranger against real ``p2pnode start`` daemons (synthetic data, no secret; the torch-free
worker, nodes.STUB: membership is the point, and it starts in a fraction of a second): the
membership rows of the hostile-input table (docs/MEMBERSHIP.md, "Hostile input"), each asserting the fixed behaviour.

The attacker is a raw HTTP client posting crafted SWIM messages (encoded exactly as a node
encodes them); the "third party" is somebody else's aiohttp server on loopback that counts
every request it gets. One two-node cluster lives through all the attacks, to pay the daemons'
start-up once, then the victim is restarted on its state dir, and finally restarted alone
after its only peer died.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from aiohttp import web
from daemon_util import http_request, metrics_text, sample_value

from nodes import STUB, NodeProc, free_port, wait_for
from p2pnode.daemon import identity
from p2pnode.membership.swim.messages import (Alive, Dead, Gossip, Left, Message, PushPull, Record, Suspect, decode,
                                              encode)
from p2pnode.membership.swim.transport import pack, unpack

pytestmark = pytest.mark.slow

HUGE = 2**63 - 1
# a short training run (then the nodes keep averaging at 1 Hz: exchanges to watch), members.json
# written every second
ARGS = [*STUB, "--set", "checkpoint.interval=1", "--set", "training.max_samples=3000"]


class ThirdParty:
    """Somebody else's web server (aiohttp, in a thread): 404 to everything, every request counted."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.addr = f"127.0.0.1:{free_port()}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.counts[(request.method, request.path)] += 1
        return web.Response(status=404, text="not here")

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = self.addr.rsplit(":", 1)
        await web.TCPSite(self._runner, host, int(port)).start()

    def __enter__(self) -> ThirdParty:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def model_requests(self) -> int:
        return sum(n for (_, path), n in self.counts.items() if path.startswith("/v1/model"))


def post(node: NodeProc, msg: Message) -> Message:
    """One crafted membership request, as a stranger sends it; the decoded reply."""
    kind = {Gossip: "gossip", PushPull: "push-pull"}[type(msg)]
    status, _, body = http_request(node.addr, "POST", f"/v1/membership/{kind}", pack(encode(msg)),
                                   headers={"Content-Type": "application/msgpack"})
    assert status == 200, (status, body[:200])
    return decode(unpack(body, 1 << 24))


def view(node: NodeProc) -> dict[str, tuple[str, int, str]]:
    """node id -> (state, incarnation, addr) as ``node`` sees its cluster."""
    return {m["node_id"]: (m["state"], m["incarnation"], m["addr"]) for m in node.status()["members"]}


def exchanged(node: NodeProc) -> int:
    t = node.status()["exchanges"]
    return int(t["done"] + t["not_modified"])


def stored_identity(node: NodeProc) -> tuple[str, int]:
    return identity.parse((node.state_dir / "identity.json").read_bytes())


@pytest.mark.timeout(300)
def test_strangers_cannot_steer_membership_of_real_daemons(cluster: Any) -> None:
    a = cluster("a", extra=ARGS)
    a_id = a.wait_ready()["node_id"]
    b = cluster("b", seeds=[a.addr], extra=ARGS)
    b_id = b.wait_ready()["node_id"]
    wait_for(lambda: set(view(a)) == {a_id, b_id} and view(a)[b_id][0] == "alive", 15, "a to see b")
    wait_for(lambda: exchanged(a) >= 1, 30, "a to exchange with b")
    b_inc = view(a)[b_id][1]

    with ThirdParty() as third:
        # 1. 10 000 made-up members in one push-pull (at addresses where nobody answers)
        ghosts = tuple(Record(f"ghost-{i:05d}", f"192.0.2.{i % 250 + 1}:{7000 + i // 250}", "alive", 0)
                       for i in range(10_000))
        reply = post(a, PushPull("stranger", False, ghosts))
        assert isinstance(reply, PushPull) and {r.node for r in reply.members} == {a_id, b_id}
        st = a.status()
        assert {m["node_id"] for m in st["members"]} == {a_id, b_id}
        assert st["membership"]["unverified"] <= 64  # SwimConfig.max_new_per_message

        # 2. 1 000 ghost ids at the third party's address, and "b moved there" in b's own name
        at_third = tuple(Record(f"far-{i:04d}", third.addr, "alive", 0) for i in range(1000))
        for i in range(3):
            post(a, PushPull(f"stranger-{i}", False, at_third))
            post(a, Gossip(b_id, (Alive(b_id, b_inc + 1, third.addr),)))

        # 3. dead / left / suspect about b from a stranger
        post(a, Gossip("stranger", (Dead(b_id, b_inc, "stranger"), Left(b_id, b_inc),
                                    Suspect(b_id, b_inc, "stranger"))))
        post(a, PushPull("stranger", False, (Record(b_id, b.addr, "left", b_inc + 1),)))

        # 4. incarnation 2^63-1, even in a member's name: about b (to a), about a itself, about b to b
        post(a, Gossip(b_id, (Left(b_id, HUGE), Suspect(b_id, HUGE, b_id), Alive(b_id, HUGE, b.addr))))
        post(a, Gossip(b_id, (Suspect(a_id, HUGE, b_id), Dead(a_id, HUGE, b_id))))
        post(b, Gossip(a_id, (Dead(b_id, HUGE, a_id),)))

        # For the next seconds: b is never left or dead in a's view, keeps its address and its
        # incarnation (give or take a refutation of its own, should a loaded machine make a probe
        # fail), the ghosts never become members, and a keeps exchanging with b.
        before = exchanged(a)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            v = view(a)
            assert set(v) == {a_id, b_id}, v
            assert v[b_id][0] in ("alive", "suspect") and v[b_id][2] == b.addr, v
            assert b_inc <= v[b_id][1] < b_inc + 10, v
            assert set(a.status()["peers"]) <= {b_id}
            time.sleep(0.2)
        wait_for(lambda: exchanged(a) >= before + 2, 30, "a to go on exchanging with b")
        # the ghosts that never answered are forgotten within seconds
        wait_for(lambda: a.status()["membership"]["unverified"] == 0, 20, "a to drop its unverified ghosts")

        # the third party got no model traffic, only the few bounded verification probes
        assert third.model_requests() == 0, third.counts
        assert sum(third.counts.values()) <= 4, third.counts
        assert set(third.counts) <= {("POST", "/v1/membership/ping")}

    text = metrics_text(a.addr)
    assert sample_value(text, "p2pnode_membership_claims_refused_total", {"reason": "message_limit"}) >= 9000
    assert sample_value(text, "p2pnode_membership_claims_refused_total", {"reason": "stranger"}) >= 4
    assert sample_value(text, "p2pnode_membership_claims_refused_total", {"reason": "incarnation"}) >= 5
    assert sample_value(text, "p2pnode_membership_verifications_total", {"result": "failed"}) >= 64
    # no incarnation ran away, none was written: the identity files are intact
    a_inc = stored_identity(a)[1]
    assert stored_identity(a)[0] == a_id and a_inc < 100
    assert stored_identity(b)[0] == b_id and stored_identity(b)[1] < 100

    # 5. members.json holds only the real peer (written every checkpoint interval)
    wait_for(lambda: json.loads((a.state_dir / "members.json").read_text()) == {"addrs": [b.addr]}, 10,
             "a's members.json to name only b")

    # 6. a restarts on its state dir: same id, next incarnation, back with b
    a.stop()
    assert a.proc.returncode == 0
    a.start()
    st = a.wait_ready()
    assert (st["node_id"], st["incarnation"]) == (a_id, a_inc + 1)
    wait_for(lambda: view(b).get(a_id, ("?",))[0] == "alive" and view(a).get(b_id, ("?",))[0] == "alive", 15,
             "a and b to see each other again")

    # 7. b dies for good; a, a first node (no --seed) whose members.json names only b, restarts alone
    wait_for(lambda: json.loads((a.state_dir / "members.json").read_text()) == {"addrs": [b.addr]}, 10,
             "a's members.json to name b")
    b.signal(signal.SIGKILL)
    b.proc.wait(10)
    a.stop()
    assert a.proc.returncode == 0
    a.start()
    st = a.wait_ready(timeout=60)  # after a few tries of b (about 8 s of back-off)
    assert st["node_id"] == a_id and st["training"]["worker_alive"]
    assert a.proc.poll() is None
    assert "no remembered member answered" in a.log()
