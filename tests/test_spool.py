"""A big model answer spooled to a file and applied from it, with the real objects on loopback: a
real aiohttp server signs and streams a snapshot, ``PeerClient.fetch`` writes it to a file as it
arrives (net/spool.py), the pipe carries the file's path (pipe_protocol over a real pipe), and a
replica cache applies it from the file mapped, a tensor's pages at a time (wire/mapped.py). The
spool's size threshold is lowered so that a model of a few MB takes the path a big one takes.
Refused bodies (a bad signature, a short body) leave no file; a bad body changes no replica."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from daemon_util import serve_get
from smaps import mapped_rss

from p2pnode.net.auth import HEADER_RESPONSE_SIG, HEADER_SIG, sign_response
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.net.deadline import Transfer
from p2pnode.net.spool import Spool
from p2pnode.pipe_protocol import PeerPayload, receive, send
from p2pnode.wire.codec import decode, encode
from p2pnode.wire.mapped import MappedBody, peer_body
from p2pnode.wire.payload import ModelSpec, NonFiniteError, PayloadError, Snapshot, TensorSpec
from p2pnode.wire.replica import ReplicaCache

SECRET = b"s" * 32
SPEC = ModelSpec("fp-spool", [TensorSpec(f"w{i}", (512, 512)) for i in range(8)])  # 8 x 1 MiB


def _files(folder: Path) -> list[str]:
    """What is left in ``folder`` once the spool's unlinking thread is done (files are removed
    off the caller's thread: a big one takes tens of milliseconds)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(folder.iterdir()):
        time.sleep(0.01)
    return sorted(p.name for p in folder.iterdir())


def _snapshot(seed: int, version: int = 1) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    arrays = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in SPEC.tensors}
    return encode(Snapshot(SPEC.header("snapshot", "peer", "e1", version), arrays)), arrays


def _signed(body: bytes, secret: bytes = SECRET, cut: int = 0):  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        sig = sign_response(secret, request.headers.get(HEADER_SIG, ""), 200, body)
        resp = web.StreamResponse(headers={"Content-Length": str(len(body)), HEADER_RESPONSE_SIG: sig})
        await resp.prepare(request)
        await resp.write(body[:len(body) - cut])
        if cut:
            request.transport.close()  # type: ignore[union-attr]
        return resp
    return handler


async def _fetch(handler, spool: Spool):  # type: ignore[no-untyped-def]
    runner, addr = await serve_get("/v1/model", handler)
    try:
        async with PeerClient(SECRET) as client:
            return await client.fetch(addr, "/v1/model", 5.0, Transfer(5.0, 30.0, 1024.0), 1 << 30, gzip=False,
                                      spool=spool)
    finally:
        await runner.cleanup()


def test_a_big_answer_is_spooled_and_applied_from_its_file(tmp_path: Path) -> None:
    body, arrays = _snapshot(1)
    spool = Spool(tmp_path / "spool", spool_from=1 << 20)
    answer = asyncio.run(_fetch(_signed(body), spool))
    assert answer.spooled is not None and answer.body == b"" and len(answer.payload) == len(body)
    assert answer.spooled.read_all() == body
    assert [p.name for p in (tmp_path / "spool").iterdir()] == [answer.spooled.path.name]  # no .part left

    # the worker gets the path over a real pipe, not the body
    ours, theirs = multiprocessing.Pipe()
    send(ours, PeerPayload(token=1, peer="peer", data=b"", path=str(answer.spooled.path)))
    msg = receive(theirs)
    assert isinstance(msg, PeerPayload) and msg.path == str(answer.spooled.path) and not msg.data

    cache = ReplicaCache(2)
    with peer_body(msg.data, msg.path) as (data, release):
        replica = cache.apply("peer", data, SPEC, len(body), release=release)
    for name, want in arrays.items():
        assert np.array_equal(replica.arrays[name], want)
    # the same replica as from the body in memory, bit for bit
    from_memory = ReplicaCache(2).apply("peer", body, SPEC, len(body))
    assert all(np.array_equal(from_memory.arrays[n], replica.arrays[n]) for n in arrays)

    answer.spooled.close()
    assert _files(tmp_path / "spool") == []


BIG = ModelSpec("fp-spool", [TensorSpec(f"w{i}", (2048, 1024)) for i in range(6)])  # 6 x 8 MiB


def test_a_spooled_body_is_never_resident_whole(tmp_path: Path) -> None:
    """While a replica is applied from a mapped body, the mapping's resident pages stay near
    one tensor (8 MiB) of the 48 MiB body, read from /proc/self/smaps (the kernel maps a file's
    pages a folio, up to 2 MiB here, at a time)."""
    rng = np.random.default_rng(2)
    arrays = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in BIG.tensors}
    body = encode(Snapshot(BIG.header("snapshot", "peer", "e1", 1), arrays))
    path = tmp_path / "one.body"
    path.write_bytes(body)
    seen: list[int] = []

    def resident() -> int:
        return mapped_rss(path)

    with MappedBody(str(path)) as mapped:
        def release(a: np.ndarray) -> None:
            seen.append(resident())
            mapped.release(a)
            seen.append(resident())
        replica = ReplicaCache(2).apply("peer", mapped.view, BIG, len(body), release=release)
    assert len(seen) == 2 + 4 * len(BIG.tensors)  # the framing, then each tensor checked and applied
    assert all(np.array_equal(replica.arrays[n], arrays[n]) for n in arrays)
    print("resident MiB before and after each release:", [round(r / 2**20, 1) for r in seen])
    assert seen[0] <= 2 * len(BIG.tensors) * 2**20, seen  # the framing's parse: a folio at each tensor's start
    assert max(seen[2:]) <= 8 * 2**20 + 2 * 2**20, seen  # a tensor, and a folio of the next one's start
    assert max(seen[1::2]) <= 2 * 2**20, seen  # just after a release


def test_a_bad_signature_or_a_short_body_leaves_no_file(tmp_path: Path) -> None:
    body, _ = _snapshot(3)
    spool = Spool(tmp_path / "spool", spool_from=1 << 20)
    with pytest.raises(PeerError, match="not signed"):
        asyncio.run(_fetch(_signed(body, secret=b"x" * 32), spool))
    assert _files(tmp_path / "spool") == []
    with pytest.raises(PeerError):
        asyncio.run(_fetch(_signed(body, cut=3 << 20), spool))
    assert _files(tmp_path / "spool") == []


def test_a_bad_spooled_body_changes_no_replica(tmp_path: Path) -> None:
    good, arrays = _snapshot(4, version=1)
    cache = ReplicaCache(2)
    cache.apply("peer", good, SPEC, len(good))
    bad_body, _ = _snapshot(5, version=2)
    bad = bytearray(bad_body)
    bad[-4:] = np.array([np.nan], np.float32).tobytes()  # the last tensor's last value
    for name, data, error in [("nan.body", bytes(bad), NonFiniteError), ("short.body", bad_body[:-100], PayloadError)]:
        path = tmp_path / name
        path.write_bytes(data)
        with peer_body(b"", str(path)) as (view, release), pytest.raises(error):
            cache.apply("peer", view, SPEC, len(good), release=release)
        replica = cache.get("peer")
        assert replica is not None and replica.version == 1
        assert all(np.array_equal(replica.arrays[n], arrays[n]) for n in arrays)
    with pytest.raises(OSError), peer_body(b"", str(tmp_path / "gone.body")):
        pass
    assert decode(good, SPEC, len(good)).header.version == 1


def test_the_bootstrap_vote_reads_spooled_models_a_chunk_at_a_time(tmp_path: Path) -> None:
    """Three voters' big snapshots, spooled and mapped: the vote's distances read them through
    the page cache, the mappings' resident pages let go chunk by chunk (smaps), and the vote
    picks the two that agree."""
    from p2pnode.exchange.bootstrap import CHUNK, MappedValues, Offer, flat_snapshot, judge
    from p2pnode.membership.base import Member

    rng = np.random.default_rng(7)
    base = {t.name: rng.standard_normal(t.numel).astype(np.float32) for t in BIG.tensors}
    offers, maps = [], []
    for i, scale in enumerate([1.0, 1.001, -1.0]):  # the third is sign-flipped: far from both
        body = encode(Snapshot(BIG.header("snapshot", f"p{i}", "e1", 1), {k: v * scale for k, v in base.items()}))
        path = tmp_path / f"{i}.body"
        path.write_bytes(body)
        mapped = MappedBody(str(path))
        maps.append(mapped)
        values = MappedValues(flat_snapshot(mapped.view, len(body), mapped.release), mapped.release)
        offers.append(Offer(Member(f"p{i}", f"127.0.0.1:{9000 + i}"), b"", values, mapped=mapped))
    seen: list[int] = []

    def resident() -> int:
        total = 0
        lines = Path("/proc/self/smaps").read_text().splitlines()
        for i, line in enumerate(lines):
            if str(tmp_path) in line and line.rstrip().endswith(".body"):
                total += next(1024 * int(f.split()[1]) for f in lines[i + 1:i + 30] if f.startswith("Rss:"))
        return total

    # sample the resident pages as the chunks are let go, after every fourth release: one read
    # of /proc/self/smaps takes 10-30 ms in a process with torch loaded, and a read after each of
    # the 288 releases was 6.3 s of this test's 7.7 s vote. Pages never let go pile up from one
    # release to the next, so they reach the samples all the same
    releases = [0]

    for mapped in maps:
        release = mapped.release

        def sampled(a: np.ndarray, release=release) -> None:  # type: ignore[no-untyped-def]
            release(a)
            releases[0] += 1
            if releases[0] % 4 == 1:
                seen.append(resident())
        mapped.release = sampled  # type: ignore[method-assign]
        for o in offers:
            if o.mapped is mapped:
                assert isinstance(o.values, MappedValues)
                o.values.release = sampled
    verdict = judge(offers, 1.0)
    assert verdict.chosen is not None and verdict.chosen.peer.node_id in ("p0", "p1")
    assert verdict.dissent == ["p2"]
    assert seen and max(seen) <= 3 * (4 * CHUNK + 2 * 2**20), max(seen)  # about a chunk of each body
    for o in offers:
        o.close()
