"""Fuzzing the membership decoder and a node's request handling (hypothesis).

Whatever bytes or structures arrive, the only failure is the decoder's clean ``MessageError``
(HTTP 400), and nothing a sequence of messages does can grow a node past its bounds or push
its incarnation past the limit.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pnode.membership.base import MAX_INCARNATION
from benchlib.swim_sim import run_virtual
from p2pnode.membership.swim import SwimConfig, SwimMembership
from p2pnode.membership.swim.messages import (MAX_ADDR, MAX_ID, MAX_RECORDS, MAX_UPDATES, REQUEST_TYPES, Alive,
                                              MessageError, decode)
from p2pnode.membership.swim.transport import Transport, TransportError, pack, unpack

LIMIT = 64 * 1024
KEYS = ["v", "t", "seq", "f", "a", "i", "target", "ta", "timeout_ms", "u", "join", "m", "n", "s"]
TYPES = ["ping", "ack", "ping-req", "nack", "gossip", "push-pull", "alive", "suspect", "dead", "left", "zombie"]

# values as they come off the wire: every msgpack type the decoder may meet, edge numbers included
scalars = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True),
    st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, 1, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1, -1]),
    st.text(max_size=300), st.sampled_from(TYPES + ["h:1", "127.0.0.1:7070", "me", "x" * 129, "a\nb", "h:0"]),
)
wire_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(st.sampled_from(KEYS), inner, max_size=8)),
    max_leaves=20,
)
# message-shaped maps: mostly the right keys with arbitrary values, sometimes exactly right
message_like = st.fixed_dictionaries(
    {"v": st.one_of(st.just(1), wire_values), "t": st.sampled_from(TYPES)},
    optional={k: wire_values for k in KEYS if k not in ("v", "t")},
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_decoder_on_arbitrary_bytes_only_raises_its_clean_error(data: bytes) -> None:
    try:
        decode(unpack(data, LIMIT))
    except MessageError as exc:
        assert len(str(exc)) < 1000  # one clear line, not an echo of the input
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(message_like, wire_values))
def test_decoder_on_arbitrary_structures_only_raises_its_clean_error(obj: Any) -> None:
    try:
        data = pack(obj)
    except (OverflowError, ValueError, TypeError):
        return  # not representable in msgpack: cannot arrive
    try:
        msg = decode(unpack(data, LIMIT))
    except MessageError as exc:
        assert len(str(exc)) < 1000
        return
    # what got through is within the documented bounds
    for name in ("sender", "target"):
        v = getattr(msg, name, None)
        assert v is None or (isinstance(v, str) and 0 < len(v) <= MAX_ID)
    assert len(getattr(msg, "updates", ())) <= MAX_UPDATES
    assert len(getattr(msg, "members", ())) <= MAX_RECORDS
    for u in getattr(msg, "updates", ()) + getattr(msg, "members", ()):
        assert 0 <= u.incarnation <= 2**63 - 1 and 0 < len(u.node) <= MAX_ID
        assert len(getattr(u, "addr", "h:1")) <= MAX_ADDR


def test_decoder_refuses_containers_over_its_limits() -> None:
    deep: Any = []
    for _ in range(10_000):
        deep = [deep]
    for obj in (deep, {"v": 1, "t": "gossip", "f": "x", "u": list(range(MAX_RECORDS + 1))},
                {f"k{i}": i for i in range(100)}):
        try:
            data = msgpack.packb(obj)
        except ValueError:  # msgpack itself refuses to nest that deep
            continue
        try:
            decode(unpack(data, 1 << 24))
        except MessageError:
            continue
        raise AssertionError(f"accepted {str(obj)[:80]}")


class Unreachable(Transport):
    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        raise TransportError("unreachable")


ids = st.sampled_from(["me", "p", "q", "stranger"]) | st.text(min_size=1, max_size=8)
incs = st.sampled_from([0, 1, 5, 2**32, 2**53 - 2, 2**63 - 1]) | st.integers(0, 2**63 - 1)
addrs = st.sampled_from(["me.test:1", "p.test:1", "q.test:1", "x.test:9"])
updates = st.one_of(
    st.fixed_dictionaries({"t": st.just("alive"), "n": ids, "i": incs, "a": addrs}),
    st.fixed_dictionaries({"t": st.sampled_from(["suspect", "dead"]), "n": ids, "i": incs, "f": ids}),
    st.fixed_dictionaries({"t": st.just("left"), "n": ids, "i": incs}),
)
records = st.fixed_dictionaries({"n": ids, "a": addrs, "s": st.sampled_from(["alive", "suspect", "dead", "left"]),
                                 "i": incs})
requests = st.one_of(
    st.fixed_dictionaries({"v": st.just(1), "t": st.just("ping"), "seq": st.integers(0, 9), "f": ids, "a": addrs,
                           "i": incs, "target": st.sampled_from(["me", "p"]), "u": st.lists(updates, max_size=5)}),
    st.fixed_dictionaries({"v": st.just(1), "t": st.just("ping-req"), "seq": st.integers(0, 9), "f": ids,
                           "target": ids, "ta": addrs, "timeout_ms": st.integers(1, 1000),
                           "u": st.lists(updates, max_size=5)}),
    st.fixed_dictionaries({"v": st.just(1), "t": st.just("gossip"), "f": ids, "u": st.lists(updates, max_size=8)}),
    st.fixed_dictionaries({"v": st.just(1), "t": st.just("push-pull"), "f": ids, "join": st.booleans(),
                           "m": st.lists(records, max_size=8)}),
    message_like,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(REQUEST_TYPES), requests), min_size=1, max_size=25))
def test_a_node_survives_any_sequence_of_requests_within_its_bounds(batch: list[tuple[str, Any]]) -> None:
    cfg = SwimConfig.lan(max_new_per_message=3, max_unverified=5, max_unverified_per_source=4)

    async def main() -> None:
        node = SwimMembership("me", "me.test:1", None, cfg, 7, transport=Unreachable(), rng=random.Random(0))
        node.apply(Alive("p", 3, "p.test:1"))  # one verified member, whose id strangers may borrow
        start_inc = node.incarnation
        for path_type, obj in batch:
            try:
                reply = await node.transport.handle_bytes(path_type, pack(obj), "198.51.100.7")
            except MessageError:
                continue
            decode(unpack(reply, 1 << 24))  # every reply is a valid message
        assert len(node.verifier) <= cfg.max_unverified
        assert {m.node_id for m in node.members()} <= {"me", "p"}  # nobody joined without a probe
        assert start_inc <= node.incarnation <= MAX_INCARNATION
        assert node.incarnation <= start_inc + len(batch) * (cfg.max_incarnation_jump + 1) * 10

    run_virtual(main)
