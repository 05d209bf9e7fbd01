"""The per-address rate and the synchronous mode: its contributions (two a training step from
every node) cost a tenth of a request, so nodes behind one address stepping fast are not
refused mid-round; and an unsigned 429 from a member's guard is reported as a refusal of its
guard, not as an answer forged or altered (three nodes of a small AdamW regression task on one
host were refused at 100 requests a second, each refusal logged as "not signed")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from daemon_util import http_request

from nodes import STUB, NodeProc, wait_for
from p2pnode.net.client import PeerClient, PeerError

SECRET = b"rate-per-step-secret"
RATE = ["--set", "http.rate_per_source=1", "--set", "http.rate_burst=4"]


def wait_serving(node: NodeProc) -> None:
    """Up, asked through /healthz only: the rate does not count it, so the bucket starts full."""
    wait_for(lambda: http_request(node.addr, "GET", "/healthz", timeout=2.0)[0] == 200, 30,
             f"{node.name} to serve")


@pytest.mark.timeout(60)
def test_sync_contributions_cost_less_of_the_rate_than_other_requests(cluster: Callable[..., NodeProc]) -> None:
    node = cluster("reducer", extra=[*STUB, *RATE, "--set", "exchange.sync=powersgd"])
    wait_serving(node)
    # 20 contributions in a burst of 4 requests' worth: none is refused by the rate (the route
    # itself refuses them: this address runs no member), where 20 status reads would be
    sync = [http_request(node.addr, "POST", "/v1/sync?phase=0&round=1&from=stranger", b"\x80")[0]
            for _ in range(20)]
    assert 429 not in sync and all(400 <= s < 500 for s in sync), sync
    status = [http_request(node.addr, "GET", "/v1/status")[0] for _ in range(6)]
    assert 429 in status, status


@pytest.mark.timeout(60)
def test_an_unsigned_429_is_named_a_refusal_of_the_guard(cluster: Callable[..., NodeProc]) -> None:
    node = cluster("guarded", extra=[*STUB, *RATE, "--set", f"node.secret={SECRET.decode()}",
                                     "--set", "exchange.sync=none"])
    wait_serving(node)

    async def ask_until_refused() -> str:
        async with PeerClient(secret=SECRET) as client:
            for _ in range(12):
                try:
                    await client.request("GET", node.addr, "/v1/status", timeout=5.0)
                except PeerError as exc:
                    return str(exc)
        return ""

    why = asyncio.run(ask_until_refused())
    assert "HTTP 429" in why and "too many requests from our address" in why, why
    assert "altered on the way" not in why, why
