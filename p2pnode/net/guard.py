"""What a request may cost before anything reads it: per-source request rates and bounded bodies.

Anyone who reaches the port can send requests, so the first middleware decides, from the
headers and the source address alone, whether a request may cost this node anything:

* **rate**: a token bucket per client IP (``http.rate_per_source`` requests a second, bursts of
  ``http.rate_burst``; ``/metrics`` counts as ``PATH_COST`` requests). Beyond it the answer is
  429 with ``Retry-After``, given after a pause of ``MAX_PAUSE`` (at most ``MAX_TARPIT``
  answers waiting at once), so a client that waits for its answers, as pollers do, makes one
  refused request a second instead of spinning this node's event loop on refusals. The table of sources is bounded (least recently seen
  dropped first), so made-up sources cannot grow it.
* **bodies**: a body is read here, streaming, under the endpoint's limit: a declared length
  over it gets 413 before reading, a chunked body 413 as soon as it passes it, never read whole
  first; a long body whose first 64 KiB cannot begin what the endpoint takes (a model payload)
  gets 400 then. At most ``http.max_body_reads`` bodies are read at once (half of them from one
  address) and at most ``http.max_inflight_bytes`` bytes are held for them (one body alone may
  be larger, as its endpoint allows: a big model's push); beyond either the answer is 503 with
  ``Retry-After``. A body that stalls for ``CHUNK_TIMEOUT`` seconds, or takes over
  ``BODY_TIMEOUT`` in all (and a second more for every ``BODY_RATE`` bytes it declares), gets
  408. A model-sized body is read into one buffer filled in a thread, never on the loop. Nothing more of a refused body is read: its
  connection is paused and cut ``LINGER_S`` later; and a refused body costs its sender
  ``REFUSED_BODY_COST`` requests of its rate. The bytes stay reserved until the handler has answered. The body is
  handed on as ``request.read()``'s cached result, so the signature check and the handlers see
  it without reading again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from p2pnode.net.bodyfill import BodyFill

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: paths never rate-limited: a supervisor's health check must not be refused for a flood
UNLIMITED_PATHS = frozenset({"/healthz"})
#: requests' worth of rate that an expensive path costs (rendering /metrics takes ~5 times a
#: status answer's CPU)
PATH_COST = {"/metrics": 5.0}
#: most refused requests held for their pause at once; beyond it refusals are immediate
MAX_TARPIT = 1024
#: longest pause before a 429
MAX_PAUSE = 1.0
#: requests' worth of rate a refused body costs its sender
REFUSED_BODY_COST = 10.0
#: seconds a refused body's connection stays open, unread, for its client to read the answer
LINGER_S = 1.0
#: seconds a body may go without a byte, and seconds its whole read may take (408 beyond)
CHUNK_TIMEOUT = 10.0
BODY_TIMEOUT = 120.0
#: bytes/s a long body's whole read is allowed beyond BODY_TIMEOUT (a 1 GB model pushed at
#: 4 MB/s or faster): the time a body may take follows its declared size
BODY_RATE = 4e6
#: bodies declared longer than this are read into one buffer filled in a thread and handed on as
#: a memoryview: only model-sized routes take them (every other endpoint's limit is 4 MiB or less)
BIG_BODY = 8 << 20


@dataclass
class GuardLimits:
    """The bounds (from ``[http]``); 0 switches a bound off."""

    rate_per_source: float = 100.0
    rate_burst: float = 200.0
    max_body_reads: int = 8
    max_inflight_bytes: int = 256 * 1024 * 1024
    max_sources: int = 4096


class TokenBuckets:
    """One token bucket per key (client IP), in a table of at most ``max_keys`` entries."""

    def __init__(self, rate: float, burst: float, max_keys: int = 4096) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, cost: float = 1.0, now: float | None = None) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 if it had them, else the seconds until it will."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= cost:
            tokens -= cost
        else:
            wait = (cost - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait


    def charge(self, key: str, n: float, now: float | None = None) -> None:
        """Take ``n`` more tokens from ``key`` (down to -burst): a refused body costs its sender
        REFUSED_BODY_COST requests' worth, so garbage senders are soon held at the door."""
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        self._buckets[key] = (max(-self.burst, tokens - n), now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)


class BodyBudget:
    """How many bodies are being read (in all, and per source: one address gets at most half
    the reads, so a few slow senders cannot take every slot), and how many bytes are held."""

    def __init__(self, max_reads: int, max_bytes: int) -> None:
        self.max_reads = max_reads
        self.max_bytes = max_bytes
        self.reads = 0
        self.bytes = 0
        self.by_source: dict[str, int] = {}

    def start(self, source: str) -> bool:
        if self.max_reads > 0:
            if self.reads >= self.max_reads or self.by_source.get(source, 0) >= max(1, self.max_reads // 2):
                return False
        self.reads += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        return True

    def end_read(self, source: str) -> None:
        self.reads -= 1
        left = self.by_source.pop(source) - 1
        if left:
            self.by_source[source] = left

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes. Beyond ``max_bytes`` only a body alone (nothing else held),
        which its endpoint's limit bounds: a big model's push is larger than the budget."""
        if self.max_bytes > 0 and self.bytes + n > self.max_bytes and self.bytes > 0:
            return False
        self.bytes += n
        return True

    def release(self, n: int) -> None:
        self.bytes -= n


class BodyRefused(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


#: given the request and the first PREFIX_BYTES of its body (or all of a shorter one): a
#: reason to refuse it (400) before reading more, or None
PrefixCheck = Callable[[web.Request, bytes], "str | None"]
PREFIX_BYTES = 64 * 1024


async def read_bounded(request: web.Request, limit: int, budget: BodyBudget,
                       prefix_check: PrefixCheck | None = None) -> tuple[bytes | memoryview, int]:
    """Read the body under ``limit`` and ``budget``; return it and the bytes reserved for it
    (to release when the request is done). Raises BodyRefused; reserves nothing then. A body
    declared over BIG_BODY (a pushed model) is read into one buffer filled in a thread
    (net/bodyfill.py: never grown, joined or copied on the event loop) and returned as a
    memoryview; it may take BODY_TIMEOUT and a second more for every BODY_RATE bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise BodyRefused(413, "too-large", f"body over {limit} bytes")
    reserved = 0
    fill: BodyFill | None = None
    try:
        if declared is not None:
            if not budget.take(declared):
                raise BodyRefused(503, "busy", "too many request bytes in flight; retry later")
            reserved = declared
        if declared is not None and declared > BIG_BODY:
            fill = BodyFill(declared)
        buf = bytearray()  # the whole body, or (with ``fill``) its first PREFIX_BYTES
        got = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BODY_TIMEOUT + (declared or 0) / BODY_RATE
        while True:
            async with asyncio.timeout_at(min(deadline, loop.time() + CHUNK_TIMEOUT)):
                chunk = await request.content.readany()
            if not chunk:
                break
            before = got
            got += len(chunk)
            if got > limit or (declared is not None and got > declared):
                raise BodyRefused(413, "too-large", f"body over {min(limit, declared or limit)} bytes")
            if fill is None:
                buf += chunk
            else:
                if before < PREFIX_BYTES:
                    buf += chunk[:PREFIX_BYTES - before]
                await fill.add(chunk)
            if prefix_check is not None and before < PREFIX_BYTES <= got:
                reason = prefix_check(request, bytes(buf[:PREFIX_BYTES]))
                if reason is not None:
                    raise BodyRefused(400, "malformed", reason)
            if got > reserved:
                if not budget.take(got - reserved):
                    raise BodyRefused(503, "busy", "too many request bytes in flight; retry later")
                reserved = got
        if fill is not None:
            if got != declared:
                raise BodyRefused(400, "malformed", f"body of {got} bytes, {declared} declared")
            return await fill.finish(), reserved
        return bytes(buf), reserved
    except BaseException:
        if fill is not None:
            fill.abandon()
        budget.bytes -= reserved
        raise


def guard_middleware(limits: GuardLimits, body_limit: Callable[[web.Request], int],
                     on_reject: Callable[[str], None] | None = None,
                     precheck: Callable[[web.Request], web.StreamResponse | None] | None = None,
                     prefix_check: PrefixCheck | None = None,
                     path_cost: Mapping[str, float] | None = None) -> tuple[Any, TokenBuckets, BodyBudget]:
    """The middleware (first in the chain), with its bucket table and body budget (for tests
    and metrics). ``body_limit(request)`` is the largest body the endpoint takes;
    ``on_reject(reason)`` ("rate-limited", "too-large", "busy", "slow-body") counts refusals;
    ``precheck(request)`` may refuse from the headers before any body is read (the signature
    check: an unsigned request's body is never read); ``prefix_check`` may refuse a long body
    from its first PREFIX_BYTES (garbage sent as a model payload); ``path_cost``: requests' worth
    of rate a path costs, beside ``PATH_COST``'s (a mode's per-step routes cost less)."""
    costs = {**PATH_COST, **(path_cost or {})}
    buckets = TokenBuckets(limits.rate_per_source, limits.rate_burst, limits.max_sources)
    budget = BodyBudget(limits.max_body_reads, limits.max_inflight_bytes)
    paused = 0

    def refuse(status: int, reason: str, message: str, retry_after: float = 1.0) -> web.Response:
        if on_reject is not None:
            on_reject(reason)
        return web.json_response({"error": message}, status=status,
                                 headers={"Retry-After": str(max(1, math.ceil(retry_after)))})

    async def refuse_and_close(request: web.Request, status: int, reason: str, message: str) -> web.StreamResponse:
        """Send the refusal, stop reading the connection, and close it LINGER_S later: a client
        still sending stalls and can read the answer (instead of a reset), and not one more byte
        of the body is read (aiohttp alone would drain it at full speed for its lingering time)."""
        resp = refuse(status, reason, message)
        buckets.charge(request.remote or "?", REFUSED_BODY_COST)
        resp.force_close()
        await resp.prepare(request)
        await resp.write_eof()
        transport = request.transport
        if transport is not None and not request.content.at_eof():
            transport.pause_reading()
            asyncio.get_running_loop().call_later(LINGER_S, request.protocol.force_close)
        return resp

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal paused
        if request.path not in UNLIMITED_PATHS:
            wait = buckets.take(request.remote or "?", costs.get(request.path, 1.0))
            if wait > 0:
                if paused < MAX_TARPIT:
                    paused += 1
                    try:
                        await asyncio.sleep(MAX_PAUSE)
                    finally:
                        paused -= 1
                return refuse(429, "rate-limited", "too many requests from this address", wait)
        if precheck is not None:
            refusal = precheck(request)
            if refusal is not None:
                return refusal
        if not request.body_exists:
            return await handler(request)
        source = request.remote or "?"
        if not budget.start(source):
            return await refuse_and_close(request, 503, "busy", "too many request bodies being read; retry later")
        reserved = 0
        try:
            try:
                body, reserved = await read_bounded(request, body_limit(request), budget, prefix_check)
            except BodyRefused as exc:
                return await refuse_and_close(request, exc.status, exc.reason, str(exc))
            except TimeoutError:
                return await refuse_and_close(request, 408, "slow-body", "request body too slow")
            finally:
                budget.end_read(source)
            # aiohttp's request.read() returns this cached copy from now on (signature check,
            # handlers), so nothing reads the stream a second time
            request._read_bytes = body  # type: ignore[attr-defined,assignment]
            return await handler(request)
        finally:
            budget.release(reserved)

    return middleware, buckets, budget
