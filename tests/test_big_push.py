"""A pushed model (POST /v1/model) of a model bigger than the old fixed limits: its body may be
as large as a payload of this model can be, not ``http.max_request_bytes``; one body alone may
be larger than the bytes-in-flight budget; it is read into one buffer off the event loop and
averaged in. A body declared over the model's own bound is still refused from its headers."""

from __future__ import annotations

import json

import msgpack
import pytest
from daemon_util import declared_post, fetch_snapshot, http_request
from nodes import STUB

PEER = "feedfacecafebeef"
PARAMS = 4_000_000  # a 16 MB snapshot


def declared(addr: str, length: int) -> int:
    """The status of a push declaring ``length`` bytes that sends only a few of them."""
    return declared_post(addr, f"/v1/model?from={PEER}", length, {"Content-Type": "application/msgpack"},
                         b"\x82" * 16)


@pytest.mark.timeout(120)
def test_a_pushed_model_over_the_request_limit_is_read_and_averaged(cluster) -> None:
    node = cluster("a", extra=[*STUB, "--set", f"training.stub_params={PARAMS}",
                               "--set", "http.max_request_bytes=4194304",  # 4 MiB: a quarter of the push
                               "--set", "http.max_inflight_bytes=8388608",  # 8 MiB: half of it
                               "--set", "exchange.accept_pushes=any"])  # PEER is no member: pushes from anyone
    node.wait_ready(60)
    own_bytes, _, _ = fetch_snapshot(node.addr)
    obj = msgpack.unpackb(own_bytes, raw=False)
    obj["node"] = PEER  # the same model, from another node
    body = msgpack.packb(obj, use_bin_type=True)
    assert len(body) > 4 * PARAMS

    status, _, reply = http_request(node.addr, "POST", f"/v1/model?from={PEER}", body,
                                    {"Content-Type": "application/msgpack"}, timeout=60.0)
    assert status == 200, reply[:300]
    assert json.loads(reply)["accepted"] is True
    assert node.status()["pushes"]["accepted"] == 1

    # over what a payload of this model can be (every element as index and value): 413 at once
    assert declared(node.addr, 9 * PARAMS) == 413
