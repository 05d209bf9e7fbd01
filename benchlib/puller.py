"""Emulated peers pulling one node's model: ``python -m benchlib.puller --addr A --loops N``.

Each of the N peers keeps one keep-alive connection and its own ``since``/``epoch`` like a real
peer (a snapshot first, then deltas). Driven line by line on stdin, one JSON line answered per
command: ``idle`` | ``flood`` (back to back) | ``paced SECONDS`` (one pull each per interval) |
``mark`` (reset the counts) | ``report`` | ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PullStats:
    count: Counter[str] = field(default_factory=Counter)  #: answers by kind
    nbytes: Counter[str] = field(default_factory=Counter)  #: body bytes by kind
    spans: list[int] = field(default_factory=list)  #: versions each merged delta spans
    dense: int | None = None  #: fp32 bytes of the whole model (from the first snapshot)
    snapshot: int | None = None  #: bytes of that snapshot

    def report(self) -> dict[str, Any]:
        return {"count": dict(self.count), "bytes": dict(self.nbytes), "spans": self.spans, "dense": self.dense,
                "snapshot": self.snapshot}


class Pullers:
    def __init__(self, addr: str, loops: int) -> None:
        self.base = f"http://{addr}/v1/model"
        self.loops = loops
        self.stats = PullStats()
        self.mode = "idle"
        self.interval = 0.05
        self.changed = asyncio.Event()

    def classify(self, status: int, headers: Any, body: bytes, since: int | None,
                 epoch: str) -> tuple[str, int | None, str]:
        """(kind of answer, the peer's next ``since`` and ``epoch``)."""
        import msgpack

        if status == 304:
            return "not_modified", since, epoch
        if status != 200:
            return f"http_{status}", None, epoch
        version = int(headers["X-P2P-Version"])
        if headers.get("X-P2P-Kind") == "snapshot":
            obj = msgpack.unpackb(body, raw=False)
            self.stats.snapshot = len(body)
            self.stats.dense = 4 * sum(math.prod(shape) for _, shape, _ in obj["specs"])
            return "snapshot", version, obj["epoch"]
        if since is not None and version == since + 1:
            return "delta", version, epoch
        self.stats.spans.append(version - (since or 0))
        return "merged", version, epoch

    async def peer(self, i: int) -> None:
        import aiohttp

        since: int | None = None
        epoch = ""
        timeout = aiohttp.ClientTimeout(total=300)  # its daemon may be SIGSTOPped a while
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout,
                                         auto_decompress=False) as s:
            due = time.monotonic()
            while self.mode != "quit":
                if self.mode == "idle":
                    self.changed.clear()
                    await self.changed.wait()
                    due = time.monotonic() + self.interval * i / self.loops  # spread the peers
                    continue
                if self.mode == "paced":
                    if due > time.monotonic():
                        await asyncio.sleep(due - time.monotonic())
                    due = max(due + self.interval, time.monotonic() - self.interval)
                    if self.mode != "paced":
                        continue
                url = self.base if since is None else f"{self.base}?since={since}&epoch={epoch}"
                try:
                    async with s.get(url, headers={"Accept-Encoding": "identity"}) as resp:  # the bytes as encoded
                        body = await resp.read()
                        status, headers = resp.status, resp.headers
                except (aiohttp.ClientError, TimeoutError):
                    self.stats.count["error"] += 1
                    since = None
                    await asyncio.sleep(0.05)
                    continue
                kind, since, epoch = self.classify(status, headers, body, since, epoch)
                self.stats.count[kind] += 1
                self.stats.nbytes[kind] += len(body)

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        reply: dict[str, Any] = {"ok": words[0]}
        if words[0] in ("idle", "flood", "paced", "quit"):
            if words[0] == "paced":
                self.interval = float(words[1])
            self.mode = words[0]
            self.changed.set()
        elif words[0] == "mark":
            self.stats = PullStats(dense=self.stats.dense, snapshot=self.stats.snapshot)
        elif words[0] == "report":
            reply = self.stats.report()
        print(json.dumps(reply), flush=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def read_stdin() -> None:
            for line in sys.stdin:
                loop.call_soon_threadsafe(self.command, line)
            loop.call_soon_threadsafe(self.command, "quit")

        threading.Thread(target=read_stdin, daemon=True).start()
        print(json.dumps({"ok": "ready"}), flush=True)
        await asyncio.gather(*(self.peer(i) for i in range(self.loops)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--loops", type=int, default=3, help="emulated peers")
    args = ap.parse_args()
    asyncio.run(Pullers(args.addr, args.loops).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
