"""Floods of bodies against a real daemon (stub worker), from raw sockets on another loopback
address (127.0.0.2), as an attacker would send them: garbage streamed chunked with no
Content-Length is refused while it streams and the daemon's memory stays bounded; slow
senders cannot take every body-read slot."""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_util import http_request, metrics_text, sample_value

from nodes import STUB, NodeProc, wait_for

ATTACKER = "127.0.0.2"
MiB = 1024 * 1024


def rss(pid: int) -> int:
    """Resident set size of a process, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_chunked(addr: str, path: str, source: str = ATTACKER, extra_headers: str = "") -> socket.socket:
    host, port = addr.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/msgpack\r\n"
                 f"{extra_headers}Transfer-Encoding: chunked\r\n\r\n".encode())
    return sock


def stream_garbage(addr: str, path: str, total: int, extra_headers: str = "") -> tuple[int | None, int]:
    """Stream ``total`` bytes of garbage chunked (no Content-Length) until the server answers;
    the answer's status (None: the connection was cut) and the bytes sent before it."""
    sock = open_chunked(addr, path, extra_headers=extra_headers)
    chunk = os.urandom(64 * 1024)
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(frame)
            sent += len(chunk)
        else:
            sock.sendall(b"0\r\n\r\n")
        sock.settimeout(10)
        line = sock.recv(64).split(b"\r\n", 1)[0].split()
        return (int(line[1]) if len(line) > 1 else None), sent
    except (ConnectionResetError, BrokenPipeError):
        return None, sent
    finally:
        sock.close()


def run_threads(n: int, fn: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


@pytest.mark.parametrize("secret", [False, True])
def test_sixteen_chunked_60mib_garbage_pushes_refused_while_streaming(cluster: Callable[..., NodeProc],
                                                                       tmp_path: Path, secret: bool) -> None:
    # bodies are the point: no 403 from the headers; gossip's routes, with a secret or without
    extra = [*STUB, "--set", "exchange.accept_pushes=any", "--set", "exchange.sync=none"]
    # with a secret, an unsigned body is refused (401) from its headers; the attacker sends a
    # made-up signature, which can only be checked once the body is in, so the body is read
    forged = f"X-P2P-Timestamp: {int(time.time())}\r\nX-P2P-Signature: {'0' * 64}\r\n" if secret else ""
    if secret:
        (tmp_path / "secret").write_text("s3cret\n")
        extra += ["--set", f"node.secret_file={tmp_path / 'secret'}"]
    victim = cluster("victim", extra=extra)
    wait_for(lambda: http_request(victim.addr, "GET", "/healthz")[0] == 200, 40, "the victim to be ready")
    before = rss(victim.pid)
    results: list[tuple[int | None, int]] = []
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss(victim.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run_threads(16, lambda i: results.append(stream_garbage(victim.addr, "/v1/model?from=x", 60 * MiB, forged)))
    finally:
        done.set()
        sampler.join()
    assert len(results) == 16
    unsigned = stream_garbage(victim.addr, "/v1/model?from=x", 60 * MiB)
    assert unsigned[0] in ((401,) if secret else (400, 413)) and unsigned[1] < 60 * MiB, unsigned
    for status, sent in results:
        # refused (400 not a payload, from its first 64 KiB; 413 too large; 503 while others are
        # read) before the 60 MiB were sent (what was sent includes the kernel's socket buffers,
        # up to tcp_rmem + tcp_wmem; a daemon that read bodies whole answers only after the end)
        assert status in (400, 413, 503, None), status
        assert sent < 60 * MiB, sent
    assert any(status in (400, 413) for status, _ in results)
    assert peak[0] - before < 64 * MiB, (before, peak[0])
    status, _, _ = http_request(victim.addr, "GET", "/healthz")
    assert status == 200
    text = metrics_text(victim.addr)
    assert sum(sample_value(text, "p2pnode_payloads_rejected_total", {"reason": r})
               for r in ("too-large", "malformed")) >= 1


def test_slow_senders_cannot_take_every_body_slot(cluster: Callable[..., NodeProc]) -> None:
    victim = cluster("victim", extra=[*STUB, "--set", "http.max_body_reads=4"])
    victim.wait_ready()
    # one address may hold at most half of the 4 read slots: its third stalled body is refused
    stalled = [open_chunked(victim.addr, "/v1/membership/ping") for _ in range(2)]
    try:
        for s in stalled:
            s.sendall(b"1\r\n\x80\r\n")  # a first byte, then nothing
        time.sleep(0.5)  # let the daemon start reading both
        third = open_chunked(victim.addr, "/v1/membership/ping")
        third.sendall(b"1\r\n\x80\r\n")
        third.settimeout(10)
        assert third.recv(64).startswith(b"HTTP/1.1 503"), "a third stalled body from one address was read"
        third.close()
        # the other half stays free for everyone else: a member's message from 127.0.0.1 is read
        status, _, _ = http_request(victim.addr, "POST", "/v1/membership/ping", b"\x80",
                                    headers={"Content-Type": "application/msgpack"})
        assert status == 400  # read and refused as a bad message, not 503
    finally:
        for s in stalled:
            s.close()
    assert sample_value(metrics_text(victim.addr), "p2pnode_payloads_rejected_total", {"reason": "busy"}) >= 1


def test_bytes_in_flight_are_bounded(cluster: Callable[..., NodeProc]) -> None:
    victim = cluster("victim", extra=[*STUB, "--set", "http.max_inflight_bytes=100000",
                                      "--set", "exchange.accept_pushes=any"])  # x is no member
    victim.wait_ready()
    part = b"\x00" * 60000  # under the 64 KiB a model body is judged from: only the byte budget stops it
    first = open_chunked(victim.addr, "/v1/model?from=x")
    second = open_chunked(victim.addr, "/v1/model?from=x", source="127.0.0.3")
    try:
        first.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")  # then stalls, holding 60 kB
        time.sleep(0.5)
        second.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")  # 120 kB in all: over the budget
        second.settimeout(10)
        assert second.recv(64).startswith(b"HTTP/1.1 503"), "a body over the in-flight budget was read"
    finally:
        first.close()
        second.close()
    # the stalled senders gone, their bytes are released: a 60 kB body is read again (and refused
    # as no payload, 400, by the worker), which 60 kB still held would not allow
    wait_for(lambda: http_request(victim.addr, "POST", "/v1/model?from=x", part)[0] == 400, 10,
             "the held bytes to be released")


def test_a_stalled_body_gets_408_and_frees_its_slot(cluster: Callable[..., NodeProc]) -> None:
    victim = cluster("victim", extra=[*STUB, "--set", "http.max_body_reads=2"])
    victim.wait_ready()
    stalled = open_chunked(victim.addr, "/v1/membership/ping")
    try:
        stalled.sendall(b"1\r\n\x80\r\n")  # one byte, then nothing: the read slot is held...
        stalled.settimeout(30)
        assert stalled.recv(64).startswith(b"HTTP/1.1 408")  # ...until the chunk timeout
    finally:
        stalled.close()
    # the address's only read slot (half of 2) is free again: its next body is read (400: no message)
    again = open_chunked(victim.addr, "/v1/membership/ping")
    try:
        again.sendall(b"1\r\n\x80\r\n0\r\n\r\n")
        again.settimeout(10)
        assert again.recv(64).startswith(b"HTTP/1.1 400")
    finally:
        again.close()
    assert sample_value(metrics_text(victim.addr), "p2pnode_payloads_rejected_total", {"reason": "slow-body"}) == 1


@pytest.mark.parametrize("secret", [False, True])
def test_chunked_64mib_to_a_membership_endpoint_refused_at_its_limit(cluster: Callable[..., NodeProc],
                                                                    secret: bool) -> None:
    extra = [*STUB, "--set", "exchange.sync=none", *(["--set", "node.secret=s3cret"] if secret else [])]
    victim = cluster("victim", extra=extra)
    wait_for(lambda: http_request(victim.addr, "GET", "/healthz")[0] == 200, 40, "the victim to be ready")
    # a made-up signature passes the header check; the body is read, under the endpoint's 64 KiB
    forged = f"X-P2P-Timestamp: {int(time.time())}\r\nX-P2P-Signature: {'0' * 64}\r\n" if secret else ""
    # 64 MiB sent only if nothing answers first: more than the socket buffers (tcp_rmem + tcp_wmem)
    status, sent = stream_garbage(victim.addr, "/v1/membership/gossip", 64 * MiB, forged)
    assert status in (413, None) and sent < 64 * MiB, (status, sent)  # answered before the end
    assert sample_value(metrics_text(victim.addr), "p2pnode_payloads_rejected_total", {"reason": "too-large"}) == 1
