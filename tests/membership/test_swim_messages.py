"""Message encoding round trips and strict, bounded decoding."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pnode.membership.base import MemberState
from p2pnode.membership.swim.messages import (MAX_UPDATES, Ack, Alive, Dead, Gossip, Left, MessageError, Nack,
                                              Ping, PingReq, PushPull, Record, Suspect, decode, encode)
from p2pnode.membership.swim.transport import pack, unpack

ids = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=128)
addrs = st.builds(lambda h, p: f"{h}:{p}", st.from_regex(r"[a-z0-9.]{1,40}", fullmatch=True), st.integers(1, 65535))
incs = st.integers(0, 2**63 - 1)
seqs = st.integers(0, 2**64 - 1)
updates = st.one_of(st.builds(Alive, ids, incs, addrs), st.builds(Suspect, ids, incs, ids),
                    st.builds(Dead, ids, incs, ids), st.builds(Left, ids, incs))
update_lists = st.lists(updates, max_size=20).map(tuple)
records = st.builds(Record, ids, addrs, st.sampled_from(list(MemberState)), incs)
messages = st.one_of(
    st.builds(Ping, seqs, ids, addrs, incs, ids, update_lists),
    st.builds(Ack, seqs, ids, update_lists),
    st.builds(Nack, seqs, ids, update_lists),
    st.builds(PingReq, seqs, ids, ids, addrs, st.integers(1, 600_000), update_lists),
    st.builds(Gossip, ids, update_lists),
    st.builds(PushPull, ids, st.booleans(), st.lists(records, max_size=20).map(tuple)),
)


@given(messages)
def test_round_trip_through_msgpack(msg) -> None:
    wire = pack(encode(msg))
    assert decode(unpack(wire, 1 << 20)) == msg


def _ping(**changes):
    d = encode(Ping(7, "a", "h:1", 3, "b", (Alive("c", 1, "h:2"),)))
    d.update(changes)
    return d


@pytest.mark.parametrize("bad,fragment", [
    (_ping(v=2), "version"),
    (_ping(t="pong"), "unknown type"),
    (_ping(seq=-1), "'seq'"),
    (_ping(seq=True), "'seq'"),  # a bool is not an integer here
    (_ping(seq="7"), "'seq'"),
    (_ping(i=2**63), "'i'"),
    (_ping(f=""), "'f'"),
    (_ping(f="x" * 129), "'f'"),
    (_ping(f="a\nb"), "'f'"),
    (_ping(a="nohost"), "HOST:PORT"),
    (_ping(a="h:99999"), "HOST:PORT"),
    (_ping(u="x"), "'u'"),
    (_ping(u=[{"t": "alive", "n": "c", "i": 1}]), "missing field(s) a"),
    (_ping(u=[{"t": "zombie", "n": "c", "i": 1}]), "unknown type"),
    (_ping(u=[{"t": "left", "n": "c", "i": 1, "extra": 1}]), "unknown field(s) extra"),
    (_ping(u=[encode(Gossip("a"))] * 2), "update"),
    (_ping(u=[{"t": "left", "n": "c", "i": 1}] * (MAX_UPDATES + 1)), "at most"),
    (_ping(extra=1), "unknown field(s) extra"),
    ({k: v for k, v in _ping().items() if k != "target"}, "missing field(s) target"),
    ([1, 2], "expected a map"),
    ({"v": 1, "t": "push-pull", "f": "a", "join": 1, "m": []}, "'join'"),
    ({"v": 1, "t": "push-pull", "f": "a", "join": False, "m": [{"n": "a", "a": "h:1", "s": "zombie", "i": 0}]},
     "'s'"),
    ({"v": 1, "t": "ping-req", "f": "a", "seq": 1, "target": "b", "ta": "h:1", "timeout_ms": 0, "u": []},
     "'timeout_ms'"),
])
def test_malformed_messages_are_rejected_with_a_clear_error(bad, fragment) -> None:
    with pytest.raises(MessageError) as err:
        decode(bad)
    assert fragment in str(err.value)


def test_byte_level_bounds() -> None:
    wire = pack(encode(Gossip("a", (Left("b", 1),))))
    assert decode(unpack(wire, len(wire))) == Gossip("a", (Left("b", 1),))
    with pytest.raises(MessageError, match="over the limit"):
        unpack(wire, len(wire) - 1)
    with pytest.raises(MessageError, match="undecodable"):
        unpack(b"\xc1garbage", 1000)
    with pytest.raises(MessageError, match="must be a map"):
        unpack(msgpack.packb([1, 2, 3]), 1000)
    with pytest.raises(MessageError, match="undecodable"):
        unpack(msgpack.packb({"v": 1, "t": "gossip", "f": b"bytes", "u": []}), 1000)  # no binary fields
    with pytest.raises(MessageError, match="undecodable"):
        unpack(msgpack.packb({1: 2}), 1000)  # map keys must be strings


def test_probe_messages_stay_small() -> None:
    """A ping with a full piggyback budget of updates is well under 2 KB."""
    from p2pnode.membership.swim.broadcast import BroadcastQueue
    q = BroadcastQueue(lambda: 4)
    for i in range(100):
        q.enqueue(Alive(f"{i:016x}", i, f"192.168.10.{i}:7070"))
    ping = Ping(2**40, "0123456789abcdef", "192.168.10.200:7070", 5, "fedcba9876543210", tuple(q.take(1400)))
    assert 1000 < len(pack(encode(ping))) < 1600
