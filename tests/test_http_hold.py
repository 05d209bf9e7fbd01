"""GET /v1/model with nothing new waits for the next publish (up to http.not_modified_hold):
a peer polling flat out gets one answer per publish instead of a flood of 304s."""

from __future__ import annotations

import time

from benchlib.cluster import finished
from daemon_util import http_request
from nodes import STUB, wait_for
from p2pnode.wire.codec import decode


def current(addr: str) -> tuple[int, str]:
    status, _, body = http_request(addr, "GET", "/v1/model")
    assert status == 200
    h = decode(body).header
    return h.version, h.epoch


def test_not_modified_is_held_until_the_next_publish(cluster) -> None:
    idle = cluster("idle", extra=[*STUB, "--set", "training.max_samples=64", "--set", "http.not_modified_hold=0.5"])
    busy = cluster("busy", extra=[*STUB, "--set", "http.not_modified_hold=0.5"])
    idle.wait_ready()
    busy.wait_ready()
    # Done and its final evaluation reported: the worker has gone idle, and alone (nothing to
    # average) it publishes nothing more.
    wait_for(lambda: finished(idle.status()), 30, "idle to finish training and its final evaluation")

    # Nothing will be published: the 304 comes after the hold, not at once.
    version, epoch = current(idle.addr)
    started = time.monotonic()
    status, headers, _ = http_request(idle.addr, "GET", f"/v1/model?since={version}&epoch={epoch}")
    waited = time.monotonic() - started
    assert status == 304 and 0.4 <= waited < 2.0, (status, waited)

    # A training node publishes every few steps: the held request turns into the next delta.
    wait_for(lambda: busy.status()["training"]["step"] > 8, 30, "busy to train")
    deltas = 0
    for _ in range(5):
        version, epoch = current(busy.addr)
        status, headers, body = http_request(busy.addr, "GET", f"/v1/model?since={version}&epoch={epoch}")
        if status == 200:
            payload = decode(body)
            assert payload.header.base_version == version and payload.header.version > version
            deltas += 1
    assert deltas >= 4, f"only {deltas} of 5 held requests got the next delta"
