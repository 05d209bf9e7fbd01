"""A peer's first fetch without a snapshot (wire/genesis.py): a fresh node names the digest of
its own x̂ at version 0 (the seeded initial model every fresh node shares); a server whose
version 0 has that digest answers with its delta from version 0, and the asker's replica,
started from its own genesis, ends bit-equal to the server's x̂. Any other digest, or a server
whose epoch began later (resumed), answers with a snapshot as before."""

from __future__ import annotations

import numpy as np
import pytest

from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.rounding import round_int8
from p2pnode.wire.genesis import DIGEST_RE, digest
from p2pnode.wire.replica import ReplicaCache, ReplicaGap
from p2pnode.wire.served import ServedModel

SPEC = ModelSpec("fpG", [TensorSpec("w", (100, 30)), TensorSpec("b", (30,))])
NODE = "srv"


def start(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}


def served(x0: dict[str, np.ndarray], publishes: int, first_version: int = 0) -> tuple[ServedModel, dict]:
    """A server reset at ``first_version`` from ``x0``, then ``publishes`` int8 deltas."""
    rng = np.random.default_rng(7)
    x = {k: v.copy() for k, v in x0.items()}
    pub = ServedModel(SPEC, NODE, "e0")
    pub.reset(Snapshot(SPEC.header("snapshot", NODE, "life", first_version), {k: v.copy() for k, v in x.items()}))
    for v in range(first_version, first_version + publishes):
        entries = {}
        for s in SPEC.tensors:
            idx = np.sort(rng.choice(s.numel, s.numel // 10, replace=False))
            vals = round_int8((rng.standard_normal(idx.size) * 0.01).astype(np.float32))
            x[s.name][idx] += vals
            entries[s.name] = (idx, vals)
        pub.publish(encode(Delta(SPEC.header("delta", NODE, "life", v + 1, base_version=v, step=v), entries), "int8"))
    return pub, x


def test_the_digest_names_the_tensors_and_nothing_else() -> None:
    x = start()
    d = digest(x, SPEC)
    assert DIGEST_RE.fullmatch(d) and d == digest({k: v.copy() for k, v in x.items()}, SPEC)
    y = {k: v.copy() for k, v in x.items()}
    y["b"][3] = np.nextafter(y["b"][3], np.float32(np.inf))  # one value, one ulp
    assert digest(y, SPEC) != d
    assert digest(x, ModelSpec("other", SPEC.tensors)) != d  # another model's fingerprint
    with pytest.raises(ValueError):
        digest({"w": x["w"], "b": x["b"][:-1]}, SPEC)


@pytest.mark.parametrize("publishes", [1, 5])
def test_a_first_fetch_naming_our_genesis_gets_a_delta_and_a_bit_equal_replica(publishes: int) -> None:
    x0 = start()
    pub, x = served(x0, publishes)
    assert pub.genesis == digest(x0, SPEC)
    ans = pub.serve(0, None, chain=True, genesis=digest(x0, SPEC))
    assert ans.status == 200 and ans.kind in ("delta", "chain") and ans.version == publishes
    snapshot = pub.serve(None, None)
    assert len(ans.body) < len(snapshot.body) / 3  # 10 % of the entries a publish
    cache = ReplicaCache(2)
    replica = cache.apply(NODE, ans.body, SPEC, genesis=x0)
    assert replica.epoch == "life" and replica.version == publishes
    for k in x:
        assert np.array_equal(replica.arrays[k], x[k])
    # and the next delta follows on as from any replica
    nxt = pub.serve(publishes, "life")
    assert nxt.status == 304


def test_serve_now_answers_the_newest_delta_to_a_genesis_at_version_0() -> None:
    x0 = start()
    pub, _ = served(x0, 1)
    cheap = pub.serve_now(0, None, digest(x0, SPEC))
    assert cheap is not None and cheap.kind == "delta"
    fresh, _ = served(x0, 0)
    assert fresh.serve_now(0, None, digest(x0, SPEC)).status == 304  # nothing published yet either side


def test_another_genesis_or_a_resumed_server_gets_a_snapshot() -> None:
    x0 = start()
    pub, _ = served(x0, 3)
    other = digest(start(seed=1), SPEC)
    assert pub.serve(0, None, chain=True, genesis=other).kind == "snapshot"
    resumed, _ = served(x0, 3, first_version=40)  # a worker resumed from a checkpoint: version 40
    assert resumed.genesis == ""
    assert resumed.serve(0, None, chain=True, genesis=digest(x0, SPEC)).kind == "snapshot"


def test_a_replica_starts_from_genesis_only_when_asked_to() -> None:
    x0 = start()
    pub, x = served(x0, 2)
    body = pub.serve(0, None, chain=True, genesis=digest(x0, SPEC)).body
    cache = ReplicaCache(2)
    with pytest.raises(ReplicaGap):  # no genesis given (a fetch that did not name it): nothing to apply to
        cache.apply(NODE, body, SPEC)
    assert NODE not in cache
    with pytest.raises(PayloadError):  # a genesis of another shape: refused, nothing kept
        cache.apply(NODE, body, SPEC, genesis={"w": x0["w"][:10], "b": x0["b"]})
    assert NODE not in cache
    cache.apply(NODE, body, SPEC, genesis=x0)
    assert all(np.array_equal(cache.get(NODE).arrays[k], x[k]) for k in x)
