"""A fresh node's start is voted on (p2pnode/exchange/bootstrap.py): a model no other peer's agrees
with is never adopted. The rule on made-up models, then real daemons (stub worker) with a
member serving its model scaled by 100 (benchlib/poison.py: a proxy in front of a real node,
verified and kept as a member by its peers)."""

from __future__ import annotations

import numpy as np
import pytest

from benchlib.poison import PoisonProxy
from daemon_util import fetch_snapshot, http_request
from nodes import STUB, NodeProc, free_port, wait_for
from p2pnode.exchange.bootstrap import Offer, distance, flat_snapshot, judge
from p2pnode.membership.base import Member
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot, TensorSpec

RADIUS = 1.0  # clip_refuse x clip_max, the defaults
RNG = np.random.default_rng(0)
HONEST = RNG.standard_normal(1000)


def offer(name: str, values: np.ndarray | None) -> Offer:
    return Offer(Member(name, f"127.0.0.1:{len(name)}"), b"", values, "" if values is not None else "HTTP 503")


def near() -> np.ndarray:
    return HONEST + 0.05 * RNG.standard_normal(HONEST.size)


@pytest.mark.parametrize("poison", [100 * HONEST, -HONEST, np.zeros_like(HONEST), RNG.standard_normal(HONEST.size)],
                         ids=["x100", "sign-flip", "zero", "random"])
def test_two_honest_peers_outvote_a_poisoned_one(poison: np.ndarray) -> None:
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        offers = [offer("a", HONEST), offer("b", near()), offer("evil", poison)]
        verdict = judge([offers[i] for i in order], RADIUS)
        assert verdict.chosen is not None and verdict.chosen.peer.node_id in ("a", "b"), verdict
        assert verdict.dissent == ["evil"] and len(verdict.agreed) == 1


@pytest.mark.parametrize("poison", [100 * HONEST, -HONEST, np.zeros_like(HONEST)], ids=["x100", "sign-flip", "zero"])
def test_one_honest_and_one_poisoned_peer_agree_on_nothing(poison: np.ndarray) -> None:
    verdict = judge([offer("evil", poison), offer("a", HONEST)], RADIUS)
    assert verdict.chosen is None and sorted(verdict.dissent) == ["a", "evil"] and "no two models" in verdict.detail


def test_a_lone_peer_is_adopted_unchecked_and_invalid_models_have_no_say() -> None:
    lone = judge([offer("a", HONEST), offer("gone", None)], RADIUS)
    assert lone.chosen is not None and lone.chosen.peer.node_id == "a" and not lone.agreed
    assert "unchecked" in lone.detail
    assert judge([offer("gone", None)], RADIUS).chosen is None
    # exchange.robust = none: not compared, the first valid one
    assert judge([offer("evil", 100 * HONEST), offer("a", HONEST)], float("inf")).chosen.peer.node_id == "evil"
    assert distance(HONEST, 100 * HONEST) == pytest.approx(99.0)


def test_only_a_full_snapshot_has_a_say() -> None:
    spec = ModelSpec("0123456789abcdef", [TensorSpec("w", (3, 4))])
    snap = encode(Snapshot(spec.header("snapshot", "a", "ep", 1), {"w": np.arange(12, dtype=np.float32)}))
    assert np.array_equal(np.concatenate(flat_snapshot(snap, 1 << 20)), np.arange(12))
    delta = encode(Delta(spec.header("delta", "a", "ep", 2, base_version=1),
                         {"w": (np.array([0]), np.array([1.0], np.float32))}))
    with pytest.raises(PayloadError, match="snapshot"):
        flat_snapshot(delta, 1 << 20)
    with pytest.raises(PayloadError):
        flat_snapshot(snap[:-3], 1 << 20)


def model(node: NodeProc) -> np.ndarray:
    _, snap, _ = fetch_snapshot(node.addr)
    return np.concatenate([snap.tensors[s.name] for s in snap.header.specs]).astype(np.float64)


def settled(node: NodeProc) -> dict:
    return wait_for(lambda: (b := node.status()["bootstrap"])["state"] != "pending" and b, 40,
                    f"{node.name}'s start to be settled")


@pytest.mark.timeout(150)
def test_a_fresh_node_never_starts_from_a_x100_model(cluster, tmp_path) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    proxy = PoisonProxy("scale100").start()
    try:
        backend = free_port()
        proxy.backend = f"127.0.0.1:{backend}"
        c = cluster("c", seeds=[a.addr], extra=[*STUB, "--advertise", proxy.addr], port=backend)
        c_id = c.wait_ready()["node_id"]
        settled(c)
        wait_for(lambda: http_request(proxy.addr, "GET", "/v1/model")[0] == 200, 20, "the x100 model to be served")

        # Two peers, one of them hostile: no two models agree, so after three votes the fresh
        # node starts from its own model, never from the x100 one.
        d = cluster("d", seeds=[a.addr], extra=STUB)
        d.wait_ready()
        boot = settled(d)
        assert boot["state"] == "own" and boot["votes"] == 3 and not boot["checked"], boot
        assert "no two models" in boot["detail"], boot
        assert d.status()["bootstrapped_from"] is None

        # Three peers (a, d honest; c hostile): the start is an honest model two peers agree on.
        b = cluster("b", seeds=[a.addr], extra=STUB)
        b.wait_ready()
        boot = settled(b)
        ids = {a.status()["node_id"], d.status()["node_id"]}
        assert boot["state"] == "adopted" and boot["checked"] and boot["from"] in ids, boot
        assert c_id not in boot["agreed"] and boot["from"] != c_id, boot
        honest = model(a)
        for n in (b, d):  # (the public copy follows the adopted model over a few publishes; one
            # snapshot a second: 2 a second from one address are served, more get 429)
            wait_for(lambda n=n: distance(model(n), honest) < RADIUS, 20, f"{n.name}'s model near a's", interval=1.0)
        assert proxy.poisoned > 0  # the x100 model was offered, and not taken
    finally:
        proxy.stop()
