"""Timed transfers through one link, run where a node runs (``ip netns exec NS python -m
benchlib.linkprobe ...``), each printing one JSON line:

- ``serve --port P --bytes N``: accept connections and send N bytes to each (a plain socket
  copy: the raw link rate, the anchor of every transfer below), until killed;
- ``copy --addr HOST:PORT``: read everything one such server sends; bytes and seconds;
- ``fetch --addr HOST:PORT [--query Q]``: GET ``/v1/model?Q`` from a node as a peer would
  (no gzip); status, body bytes, seconds to the headers and to the last byte, the version and
  epoch the answer names.

The bytes are read into one reused buffer, so the probe's own memory stays small whatever it
receives.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import time

CHUNK = 1 << 20


def serve(port: int, nbytes: int, host: str) -> None:
    block = bytes(CHUNK)
    with socket.create_server((host, port), reuse_port=False) as srv:
        print(json.dumps({"listening": port}), flush=True)
        while True:
            conn, _ = srv.accept()
            with conn:
                left = nbytes
                while left > 0:
                    n = conn.send(memoryview(block)[:min(CHUNK, left)])
                    left -= n


def copy(addr: str) -> dict[str, float]:
    host, port = addr.rsplit(":", 1)
    buf = bytearray(CHUNK)
    got = 0
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=600) as s:
        while n := s.recv_into(buf):
            got += n
    return {"bytes": got, "seconds": time.monotonic() - began}


def fetch(addr: str, query: str, timeout: float) -> dict[str, object]:
    host, port = addr.rsplit(":", 1)
    buf = bytearray(CHUNK)
    began = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", f"/v1/model?{query}" if query else "/v1/model")
        resp = conn.getresponse()
        headed = time.monotonic()
        got = 0
        while n := resp.readinto(buf):  # type: ignore[arg-type]
            got += n
        ended = time.monotonic()
        return {"status": resp.status, "bytes": got, "seconds": ended - began, "transfer_s": ended - headed,
                "headers_s": headed - began, "kind": resp.getheader("X-P2P-Kind", ""),
                "version": resp.getheader("X-P2P-Version", ""), "epoch": resp.getheader("X-P2P-Epoch", "")}
    finally:
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bytes", type=int, required=True)
    s.add_argument("--host", default="0.0.0.0")
    c = sub.add_parser("copy")
    c.add_argument("--addr", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--addr", required=True)
    f.add_argument("--query", default="")
    f.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    if args.cmd == "serve":
        serve(args.port, args.bytes, args.host)
        return 0
    out = copy(args.addr) if args.cmd == "copy" else fetch(args.addr, args.query, args.timeout)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
