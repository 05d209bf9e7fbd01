"""The stub worker (p2pnode/worker/stub.py) averages under the same robust rule as the torch
worker (p2pnode/worker/robust.py): a model 100 times ours is refused as an outlier and changes
nothing, one a little beyond the radius is averaged with a clipped weight; with
``exchange.robust = "none"`` the same x100 model is averaged in (so the test can fail). Run in
this process over a real pipe; and the radius never collapses to 0."""

from __future__ import annotations

from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import pytest

from p2pnode.config import Config
from p2pnode.pipe_protocol import Applied, PeerPayload, decode
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Snapshot
from p2pnode.worker.robust import MIN_RATIO, ClipRadius
from p2pnode.worker.stub import SPEC, StubWorker

PEER = "feedfacecafebeef"


def stub(tmp_path: Path, robust: str) -> tuple[StubWorker, object]:
    cfg = Config()
    cfg.node.state_dir = str(tmp_path)
    cfg.exchange.robust = robust
    ours, theirs = Pipe()
    return StubWorker(ours, cfg, "me"), theirs


def offer(worker: StubWorker, conn: object, version: int, tensors: dict[str, np.ndarray], peer: str = PEER) -> Applied:
    body = encode(Snapshot(SPEC.header("snapshot", peer, "ep", version), tensors))
    worker.on_peer(PeerPayload(token=version, peer=peer, data=body))
    msg = decode(conn.recv_bytes())  # type: ignore[attr-defined]
    assert isinstance(msg, Applied)
    return msg


def flat(x: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([x[s.name] for s in SPEC.tensors])


def test_the_stub_refuses_a_x100_model_and_clips_a_far_one(tmp_path: Path) -> None:
    worker, conn = stub(tmp_path, "clip")
    # an honest peer met first, 10 % away (a poisoned model is refused as the odd one among peers)
    rng = np.random.default_rng(1)
    near = {k: v + 0.1 * np.linalg.norm(v) / np.sqrt(v.size) * rng.standard_normal(v.shape).astype(np.float32)
            for k, v in worker.x.items()}
    assert offer(worker, conn, 1, near, peer="0123456789abcdef").ok
    before = flat(worker.x).copy()
    refused = offer(worker, conn, 1, {k: 100 * v for k, v in worker.x.items()})
    assert not refused.ok and refused.reason == "outlier" and refused.radius == 0.25, refused
    assert np.array_equal(flat(worker.x), before)  # nothing changed

    # half of ||x|| away: beyond the radius 0.25, within 4 x it: averaged with weight 0.5 x 0.25 / 0.5
    direction = np.random.default_rng(0).standard_normal(before.size).astype(np.float32)
    direction *= 0.5 * np.linalg.norm(before) / np.linalg.norm(direction)
    far, at = {}, 0
    for s in SPEC.tensors:
        far[s.name] = worker.x[s.name] + direction[at:at + s.numel]
        at += s.numel
    clipped = offer(worker, conn, 2, far)
    assert clipped.ok and clipped.clipped and clipped.distance == pytest.approx(0.5, rel=1e-4), clipped
    assert clipped.weight == pytest.approx(0.5 * clipped.radius / clipped.distance, rel=1e-4)
    moved = float(np.linalg.norm(flat(worker.x) - before))
    assert moved == pytest.approx(clipped.weight * 0.5 * float(np.linalg.norm(before)), rel=1e-3)


def test_without_robust_averaging_the_stub_takes_the_x100_model(tmp_path: Path) -> None:
    worker, conn = stub(tmp_path, "none")
    before = flat(worker.x).copy()
    applied = offer(worker, conn, 1, {k: 100 * v for k, v in worker.x.items()})
    assert applied.ok and applied.weight == 0.5 and applied.radius == -1.0
    assert np.allclose(flat(worker.x), 50.5 * before)


def test_the_radius_never_falls_to_zero_and_widens_again() -> None:
    clip = ClipRadius()
    for _ in range(3):  # models bit-identical to ours: distance 0
        assert clip.decide("twin", 0.0).scale == 1.0
    assert clip.radius() == MIN_RATIO
    exchanges = 0
    while clip.radius() < 0.1 / 4:  # the twin moves off by 10 %: averaged unrefused again in time
        clip.decide("twin", 0.1)
        exchanges += 1
        assert exchanges < 20  # with tau = 0 it would be refused for ever (3 x 0 = 0)
    assert not clip.decide("twin", 0.1).refused
