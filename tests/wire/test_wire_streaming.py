"""The pieces of the streaming exchange path, each on its own: the msgpack reader whose bins are
views (it reads what msgpack writes and refuses what a payload may not hold), a payload's limit
from the model, parts that join to encode's bytes, big pipe fields as raw frames over a real
pipe, and a body's deadline from its size and its peer's measured rate."""

from __future__ import annotations

import multiprocessing
import threading

import msgpack
import numpy as np
import pytest

from p2pnode.net.deadline import CUTOFF, SLACK, Transfer, update_rate
from p2pnode.pipe_protocol import BIG_FIELD, Parts, PeerPayload, Published, receive, send
from p2pnode.wire.codec import delta_parts, encode, encode_body, encode_parts, max_encoded_bytes, payload_limit
from p2pnode.wire.msgview import Malformed, unpack
from p2pnode.wire.payload import Delta, ModelSpec, Snapshot, TensorSpec

SPEC = ModelSpec("fp", [TensorSpec("w", (300, 700)), TensorSpec("b", (300,))])


def test_the_reader_gives_what_msgpack_wrote_with_bins_as_views() -> None:
    obj = {"a": [1, -1, 300, -70000, 2**40, -(2**40), 1.5, None, True, False, "é" * 40],
           "bin": b"x" * 70000, "small": b"ab", "m": {"k": [[]]}}
    data = msgpack.packb(obj, use_bin_type=True)
    got = unpack(data)
    assert isinstance(got["bin"], memoryview) and got["bin"].obj is data  # a view, not a copy
    assert {**got, "bin": bytes(got["bin"]), "small": bytes(got["small"])} == obj


@pytest.mark.parametrize("bad", [
    msgpack.packb({"a": 1})[:-1],  # truncated
    msgpack.packb({"a": 1}) + b"\x00",  # something after it
    msgpack.packb({1: 2}),  # a key that is not a string
    b"\x82\xa1a\x01\xa1a\x02",  # a repeated key
    b"\xd4\x01\x00",  # an extension type
    b"\xc6\xff\xff\xff\xff",  # a bin longer than the input
    b"\xdd\xff\xff\xff\xff",  # an array longer than the input could hold
    b"\x91" * 20 + b"\x00",  # nested too deep
])
def test_the_reader_refuses_what_a_payload_may_not_hold(bad: bytes) -> None:
    with pytest.raises(Malformed):
        unpack(bad)


def test_a_payload_limit_follows_the_model() -> None:
    x = {t.name: np.random.default_rng(1).standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    everything = {t.name: (np.arange(t.numel), x[t.name]) for t in SPEC.tensors}
    for payload in (Snapshot(SPEC.header("snapshot", "n", "e", 1), x),
                    Delta(SPEC.header("delta", "n", "e", 1, base_version=0, op="set"), everything)):
        assert len(encode(payload)) <= max_encoded_bytes(SPEC)
    assert max_encoded_bytes(SPEC) < 8.1 * SPEC.numel + 70000  # about 8 bytes a parameter
    assert payload_limit(SPEC) == max_encoded_bytes(SPEC)
    assert payload_limit(SPEC, 1000) == 1000  # http.max_payload_bytes only caps it


def test_parts_join_to_the_encoding() -> None:
    x = {t.name: np.random.default_rng(2).standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    snap = Snapshot(SPEC.header("snapshot", "n", "e", 3, step=2, loss=0.5), x)
    parts = encode_parts(snap)
    assert any(isinstance(p, memoryview) and p.obj is not None for p in parts)
    assert b"".join(parts) == encode(snap) == bytes(encode_body(snap))
    idx = np.sort(np.random.default_rng(3).choice(SPEC.tensors[0].numel, 60000, replace=False))
    delta = Delta(SPEC.header("delta", "n", "e", 4, base_version=3), {"w": (idx, x["w"][idx])})
    assert bytes(encode_body(delta)) == encode(delta)


def test_big_pipe_fields_cross_as_frames_into_one_buffer() -> None:
    a, b = multiprocessing.Pipe()
    data = np.random.default_rng(4).bytes(3 * BIG_FIELD + 5)
    writer = threading.Thread(target=send, args=(a, PeerPayload(token=7, peer="p", data=data, nth=2)))
    writer.start()
    got = receive(b)
    writer.join()
    assert isinstance(got, PeerPayload) and got.token == 7 and got.nth == 2 and bytes(got.data) == data
    send(a, PeerPayload(token=8, peer="p", data=b"small"))
    small = receive(b)
    assert isinstance(small, PeerPayload) and small.data == b"small"


def test_a_payload_in_parts_crosses_the_pipe_as_one_buffer_never_joined_by_the_sender() -> None:
    """What a worker's publish sends (worker/public.py ``publish_parts``): a delta encoded in
    parts, the values as views of their arrays; the daemon reads the joined bytes."""
    spec = ModelSpec("fp", [TensorSpec("w", (1000, 700)), TensorSpec("b", (300,))])
    x = {t.name: np.random.default_rng(5).standard_normal(t.numel).astype(np.float32) for t in spec.tensors}
    every = np.arange(spec.tensors[0].numel)
    delta = Delta(spec.header("delta", "n", "e", 4, base_version=3), {"w": (every, x["w"]), "b": (every[:7], x["b"][:7])})
    parts = delta_parts(delta)
    assert sum(memoryview(p).nbytes for p in parts) >= BIG_FIELD
    assert any(isinstance(p, memoryview) and p.nbytes >= BIG_FIELD // 4 for p in parts)  # views, not copies
    a, b = multiprocessing.Pipe()
    writer = threading.Thread(target=send, args=(a, Published(version=4, delta=Parts(parts))))
    writer.start()
    got = receive(b)
    writer.join()
    assert isinstance(got, Published) and got.version == 4 and bytes(got.delta) == encode(delta)
    # parts of many small pieces and under BIG_FIELD in all go inline, joined
    small = Parts([b"ab", memoryview(b"cd"), bytearray(b"e")] * 1000)
    send(a, Published(version=5, delta=small))
    got = receive(b)
    assert isinstance(got, Published) and bytes(got.delta) == b"abcde" * 1000


def test_a_bodys_deadline_follows_its_size_and_the_peers_rate() -> None:
    unknown = Transfer(floor=2.0, ceiling=600.0, min_rate=256 * 1024)
    assert unknown.deadline(0) == 2.0
    assert unknown.deadline(100 * 1024 * 1024) == pytest.approx(2.0 + 400.0)  # at the slowest rate allowed
    assert unknown.deadline(10**12) == 600.0  # the ceiling
    measured = Transfer(2.0, 600.0, 256 * 1024, rate=100e6)
    assert measured.deadline(400_000_000) == pytest.approx(2.0 + SLACK * 4.0)
    assert measured.cutoff == 100e6 / CUTOFF and unknown.cutoff == 256 * 1024
    assert measured.first_byte(0) == 2.0 < measured.first_byte(1_400_000_000) < 600.0
    rate = update_rate(0.0, 10_000_000, 0.1)
    assert rate == pytest.approx(100e6)
    assert update_rate(rate, 1000, 10.0) == rate  # too short to measure throughput by
    assert 0 < update_rate(rate, 10_000_000, 1.0) < rate
