"""Property: whatever `since` a peer asks with, the replica it builds from the answer is
bit-equal (np.array_equal) to the publisher's x̂ — through merged deltas, evictions, float16
values, epoch changes — and the publisher's x̂ is bit-equal to the worker's."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pnode.wire.rounding import round_int8
from p2pnode.wire.codec import decode, encode
from p2pnode.wire.payload import Delta, ModelSpec, Snapshot, TensorSpec
from p2pnode.wire.replica import Replica, ReplicaCache
from p2pnode.wire.served import ServedModel

NODE = "pub"

shapes = st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple)
specs = st.lists(shapes, min_size=1, max_size=3).map(
    lambda ss: ModelSpec("fpH", [TensorSpec(f"t{i}", s) for i, s in enumerate(ss)]))


def _op(roll: int, seed: int, density: float, back: int) -> tuple:
    """Weighted script step: mostly publishes and serves inside the log, few resets."""
    if roll < 40:  # seed also picks float16 values when divisible by 3
        return ("publish", seed, density)
    if roll < 70:
        return ("serve", "back", back)
    if roll < 82:
        return ("serve", ("unknown", "none", "epoch")[seed % 3], back)
    if roll < 95:
        return ("follow", 0, 0)
    return ("reset", seed, 0)


ops = st.lists(st.builds(_op, st.integers(0, 99), st.integers(0, 2**32 - 1),
                         st.floats(0.0, 1.0), st.integers(0, 7)), min_size=8, max_size=50)


def random_state(spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {s.name: (rng.standard_normal(s.numel) * 10).astype(np.float32)
            for s in spec.tensors}


def equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def replica_arrays(r: Replica) -> dict[str, np.ndarray]:
    return {k: t.numpy() for k, t in r.tensors.items()}


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs, log_size=st.integers(0, 10), small_bytes=st.sampled_from([False, False, True]),
       script=ops)
def test_served_payloads_rebuild_x_hat_exactly(spec: ModelSpec, log_size: int,
                                               small_bytes: bool, script: list) -> None:
    pub = ServedModel(spec, NODE, "e0", log_size=log_size,
                      log_bytes=600 if small_bytes else 1 << 20)
    rng = np.random.default_rng(0)
    epoch_no = 0
    x = random_state(spec, rng)  # the worker's x̂
    pub.reset(Snapshot(spec.header("snapshot", NODE, "e0", 0), x))
    history = {("e0", 0): {k: v.copy() for k, v in x.items()}}
    follower = ReplicaCache(1)

    for op, a, b in script:
        epoch, version = pub.epoch, pub.version
        if op == "publish":
            r = np.random.default_rng(a)
            entries = {}
            for s in spec.tensors:
                mask = r.random(s.numel) < b
                idx = np.flatnonzero(mask)
                # magnitudes over six decades: sums round differently in different orders
                vals = r.standard_normal(idx.size) * 10.0 ** r.uniform(-3, 3, idx.size)
                entries[s.name] = (idx, vals.astype(np.float32))
            hdr = spec.header("delta", NODE, epoch, version + 1, base_version=version,
                              loss=float(b), step=version + 1)
            vdt = "float16" if a % 3 == 0 else "int8" if a % 3 == 1 else "float32"
            if vdt == "int8":  # the publisher rounds first (one power-of-two scale an entry)
                entries = {k: (i, round_int8(v)) for k, (i, v) in entries.items()}
            data = encode(Delta(hdr, entries), vdt)
            decoded = decode(data, spec)
            for name, (idx, vals) in decoded.entries.items():  # the worker applies decoded q
                x[name][idx] += vals
            assert pub.publish(data) == version + 1
            history[(epoch, version + 1)] = {k: v.copy() for k, v in x.items()}
            assert equal(decode(pub.serve(None, None).body, spec).tensors, x)
        elif op == "reset":
            epoch_no += 1
            x = random_state(spec, np.random.default_rng(a))
            new_epoch, new_version = f"e{epoch_no}", a % 5
            pub.reset(encode(Snapshot(spec.header("snapshot", NODE, new_epoch, new_version), x)))
            history[(new_epoch, new_version)] = {k: v.copy() for k, v in x.items()}
        elif op == "follow":
            held = follower.get(NODE)
            asked = (held.epoch, held.version) if held is not None else None
            res = pub.serve(asked[1] if asked else None, asked[0] if asked else None, chain=a % 2 == 0)
            if res.status == 304:
                assert asked == (epoch, version)
            else:
                follower.apply(NODE, res.body, spec, max_bytes=1 << 24)
            assert equal(replica_arrays(follower.get(NODE)), x)
        else:  # serve to a peer whose replica sits at `since`
            since, ask_epoch = {
                "back": (version - b, epoch),
                "unknown": (version + 1 + b if b % 2 else -1 - b, epoch),
                "none": (None, None),
                "epoch": (version - b, "other"),
            }[a]
            res = pub.serve(since, ask_epoch)
            in_log = (ask_epoch == epoch and since is not None
                      and version - pub.log_len <= since < version)
            if ask_epoch == epoch and since == version:
                assert (res.status, res.kind, res.body) == (304, "not_modified", b"")
                continue
            assert res.status == 200 and res.version == version
            assert res.kind == ("delta" if in_log else "snapshot")
            replica = Replica(spec, NODE)
            payload = decode(res.body, spec)
            if isinstance(payload, Delta):
                replica.apply(Snapshot(spec.header("snapshot", NODE, epoch, since),
                                       history[(epoch, since)]))
            replica.apply(payload, validate=False)
            assert (replica.epoch, replica.version) == (epoch, version)
            assert equal(replica_arrays(replica), x)
