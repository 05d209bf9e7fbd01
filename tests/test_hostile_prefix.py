"""A long body sent as a model payload is judged from its first 64 KiB: garbage, or a payload of
another model, is refused there, while every real payload (snapshot or delta, cut anywhere)
passes on to the full decode."""

from __future__ import annotations

import random

import numpy as np

from p2pnode.wire.codec import encode
from p2pnode.wire.payload import Delta, ModelSpec, Snapshot, TensorSpec
from p2pnode.wire.prefix import PREFIX_BYTES, prefix_error

SPEC = ModelSpec("fp-prefix", [TensorSpec("w", (300, 300)), TensorSpec("b", (300,))])


def payloads() -> list[bytes]:
    rng = np.random.default_rng(0)
    x = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    snap = encode(Snapshot(SPEC.header("snapshot", "n", "e", 7), x))
    idx = np.sort(rng.choice(90000, 5000, replace=False))
    delta = encode(Delta(SPEC.header("delta", "n", "e", 8, base_version=7, op="add"),
                         {"w": (idx, rng.standard_normal(5000).astype(np.float32))}))
    return [snap, delta]


def test_real_payloads_pass_at_any_cut() -> None:
    for body in payloads():
        for cut in (1, 2, 10, 100, 1000, PREFIX_BYTES, len(body)):
            assert prefix_error(body[:cut], SPEC) is None, cut


def test_garbage_and_other_models_are_refused() -> None:
    # A prefix that ends before it can tell is let through by design (the full decode decides),
    # and now and then random bytes do that (a map header, then a long key string running past
    # the prefix): seeded, and judged on the share refused.
    rng = random.Random(1234)
    refused = sum(prefix_error(rng.randbytes(PREFIX_BYTES), SPEC) is not None for _ in range(2000))
    assert refused >= 1990, refused
    other = ModelSpec("another", SPEC.tensors)
    for body in payloads():
        assert "fingerprint" in (prefix_error(body[:PREFIX_BYTES], other) or "")
