"""The hostile-input row "a stranger POSTing an all-zero model 20 times (no secret)": refused (403) from
the headers, counted, and the victim's public model unchanged; a running member's push, from its
own host, is taken (p2pnode/daemon/push.py, ``exchange.accept_pushes = "members"``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from daemon_util import fetch_snapshot, http_request, metrics_text, sample_value
from nodes import STUB, wait_for
from p2pnode.daemon.push import same_host
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import ModelSpec, Snapshot

STRANGER = "feedfacecafebeef"
REJECTED = "p2pnode_payloads_rejected_total"
DONE = [*STUB, "--set", "training.max_samples=64"]


def push(addr: str, peer: str, body: bytes) -> tuple[int, dict]:
    status, _, reply = http_request(addr, "POST", f"/v1/model?from={peer}", body,
                                    {"Content-Type": "application/msgpack"})
    return status, json.loads(reply)


@pytest.mark.timeout(90)
def test_a_strangers_zero_model_is_refused_and_a_members_push_is_taken(cluster) -> None:
    a = cluster("a", extra=DONE)
    a.wait_ready()
    wait_for(lambda: a.status()["training"]["done"], 30, "a's training to stop")
    _, own, version = fetch_snapshot(a.addr)
    spec = ModelSpec(own.header.fingerprint, list(own.header.specs))
    zeros = encode(Snapshot(spec.header("snapshot", STRANGER, "ep", 1),
                            {s.name: np.zeros(s.numel, np.float32) for s in spec.tensors}))
    before = metrics_text(a.addr)

    for _ in range(20):
        status, reply = push(a.addr, STRANGER, zeros)
        assert status == 403, reply
        assert "members only" in reply["error"] and STRANGER in reply["error"], reply

    after = metrics_text(a.addr)
    assert sample_value(after, REJECTED, {"reason": "not-member"}) - \
        sample_value(before, REJECTED, {"reason": "not-member"}) == 20
    pushes = a.status()["pushes"]
    assert pushes["accept"] == "members" and pushes["refused"] == 20 and pushes["accepted"] == 0, pushes
    assert pushes["last_refused"]["from"] == STRANGER, pushes
    _, again, version_after = fetch_snapshot(a.addr)  # nothing changed: same version, bit for bit
    assert version_after == version
    for name, values in own.tensors.items():
        assert np.array_equal(values, again.tensors[name]), f"{name} changed"

    # A member (b, verified by a, on loopback as the test is) may push: b's own model is taken.
    b = cluster("b", seeds=[a.addr], extra=DONE)
    b_id = b.wait_ready()["node_id"]
    wait_for(lambda: any(m["node_id"] == b_id and m["state"] == "alive" for m in a.status()["members"]), 20,
             "a to verify b")
    # (b serves no model until its start from a's is settled: 503 for the first moment)
    wait_for(lambda: http_request(b.addr, "GET", "/v1/model")[0] == 200, 20, "b to serve its model")
    b_model, _, _ = fetch_snapshot(b.addr)
    status, reply = push(a.addr, b_id, b_model)
    assert status == 200 and reply["accepted"], reply
    assert a.status()["pushes"]["accepted"] == 1
    # ... and the stranger is still refused, naming a member's id or not
    assert push(a.addr, STRANGER, zeros)[0] == 403


def test_a_push_must_come_from_the_members_advertised_host() -> None:
    assert same_host("127.0.0.1:7070", "127.0.0.1")
    assert same_host("127.0.0.1:7070", "127.0.0.2")  # loopback is loopback
    assert same_host("localhost:7070", "::1")
    assert same_host("[::1]:7070", "127.0.0.1")
    assert same_host("10.0.0.5:7070", "::ffff:10.0.0.5")  # an IPv4-mapped source
    assert not same_host("10.0.0.5:7070", "10.0.0.6")
    assert not same_host("10.0.0.5:7070", "127.0.0.1")  # a member's id from this host is not the member
    assert not same_host("127.0.0.1:7070", "10.0.0.5")
    assert not same_host("node1.example:7070", "10.0.0.5")  # names are not resolved on a request
    assert not same_host("10.0.0.5:7070", None)
