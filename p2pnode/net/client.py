"""The one HTTP client a node uses to talk to peers.

One keep-alive ``aiohttp.ClientSession`` for the node's life; every call has an explicit
total timeout; with a cluster secret requests are signed and answers checked (an answer whose
signature does not match is a PeerError); redirects are not followed
(a 3xx is handed back as the answer, which callers treat as a failure). Errors come out as
``PeerError`` so callers handle one exception type. A caller may take a gzip answer
(``gzip=True``: ``Accept-Encoding: gzip`` and the query's ``gzip=1``, net/encoding.py; what a
model fetch asks for): it is checked as sent (the signature covers the bytes on the wire), then
inflated, never past the body limit.
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack

from p2pnode.net.auth import HEADER_RESPONSE_SIG, HEADER_SIG, sign, sign_response, sign_response_digest
from p2pnode.net.bodyfill import BodyFill
from p2pnode.net.deadline import STALL_WINDOW, Transfer
from p2pnode.net.encoding import gunzip, with_gzip_marker
from p2pnode.net.spool import Spool, SpooledBody, SpoolFill
from p2pnode.wire.msgview import Body
from p2pnode.wire.payload import mismatch

#: why an unsigned answer can come from an honest member: its guard answers these before any
#: signature check (p2pnode/net/guard.py), so they say nothing of the cluster secret
GUARD_REFUSALS = {
    408: "its guard's refusal, before any signature check: our body came too slowly",
    413: "its guard's refusal, before any signature check: our body is over its limit",
    429: "its guard's refusal, before any signature check: too many requests from our address",
    503: "its guard's refusal, before any signature check: too many bodies being read",
}

MSGPACK = "application/msgpack"


class PeerError(Exception):
    """A peer did not answer usefully: timeout, connection refused, bad status or body."""


class PeerTimeout(PeerError):
    """The peer did not answer within the call's timeout."""


@dataclass
class Response:
    status: int
    body: bytes  # inflated, where it came as gzip
    headers: dict[str, str]
    wire_bytes: int = 0  # the body's length as it came: what the network carried


@dataclass
class ModelAnswer:
    """A model fetch's answer (:meth:`PeerClient.fetch`): its body read into one buffer (a
    memoryview when big, never zeroed first), or, for a big body fetched with a spool, written
    to a file (``spooled``; ``body`` is then empty); and how long the body took."""

    status: int
    body: Body
    headers: dict[str, str]
    wire_bytes: int = 0
    body_seconds: float = 0.0  # from the answer's headers to its last byte
    spooled: SpooledBody | None = None

    @property
    def payload(self) -> Body | SpooledBody:
        """The body, wherever it is (what ``WorkerPipe.deliver`` takes)."""
        return self.spooled if self.spooled is not None else self.body


#: bodies up to this long are hashed, inflated and checked on the event loop; longer ones in a thread
INLINE_BYTES = 1 << 20
#: the largest answer a call takes unless it says otherwise (the exchange's fetches say: their
#: model's bound, wire/codec.py payload_limit)
DEFAULT_MAX_BODY = 512 * 1024 * 1024


class PeerClient:
    def __init__(self, secret: bytes | None = None, ssl: Any = None, max_body: int = DEFAULT_MAX_BODY,
                 user_agent: str = "p2pnode") -> None:
        self._secret = secret
        self._ssl = ssl
        self._max_body = max_body
        self._session: aiohttp.ClientSession | None = None
        self._ua = user_agent
        self.bytes_sent = 0
        self.bytes_received = 0

    @property
    def scheme(self) -> str:
        return "https" if self._ssl else "http"

    async def __aenter__(self) -> PeerClient:
        self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl else False)
            self._session = aiohttp.ClientSession(connector=connector, headers={"User-Agent": self._ua},
                                                  auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, addr: str, path_qs: str, body: bytes = b"", timeout: float = 1.0,
                      content_type: str = MSGPACK, gzip: bool = False, max_body: int | None = None) -> Response:
        """Send one request; raise PeerError on any failure, timeout included. ``gzip``: a gzip
        answer is welcome (and inflated); without it none is asked for and one is refused.
        ``max_body``: the largest answer taken (the client's default otherwise); ``timeout``
        bounds the whole call."""
        a = await self._call(method, addr, path_qs, body, timeout, content_type, gzip, max_body, None)
        return Response(a.status, a.body if isinstance(a.body, bytes) else bytes(a.body), a.headers, a.wire_bytes)

    async def fetch(self, addr: str, path_qs: str, first_byte: float, transfer: Transfer, max_body: int,
                    gzip: bool = True, model: str = "", spool: Spool | None = None) -> ModelAnswer:
        """GET a model: its answer must begin within ``first_byte`` seconds, its body then has
        ``transfer``'s deadline from its size and is cut off below ``transfer``'s rate. ``model``:
        our fingerprint; an answer whose ``X-P2P-Model`` names another is refused before its body
        is read, naming both (another task's model can be larger than any payload of ours, and
        "over the limit" would hide why). ``spool``: a body it wants (big, of a declared length)
        is written to a file there as it arrives (``ModelAnswer.spooled``; net/spool.py); the
        caller closes it once done with it."""
        return await self._call("GET", addr, path_qs, b"", first_byte, MSGPACK, gzip, max_body, transfer, model,
                                spool)

    async def _call(self, method: str, addr: str, path_qs: str, body: bytes, timeout: float, content_type: str,
                    gzip: bool, max_body: int | None, transfer: Transfer | None, model: str = "",
                    spool: Spool | None = None) -> ModelAnswer:
        self.open()
        assert self._session is not None
        limit = self._max_body if max_body is None else max_body
        headers = {"Content-Type": content_type} if body else {}
        headers["Accept-Encoding"] = "gzip" if gzip else "identity"
        if gzip:
            path_qs = with_gzip_marker(path_qs)
        request_sig = ""
        if self._secret:
            signed = sign(self._secret, method, path_qs, body)
            request_sig = signed[HEADER_SIG]
            headers.update(signed)
        url = f"{self.scheme}://{addr}{path_qs}"
        loop = asyncio.get_running_loop()
        allowed = f"no answer within {timeout:g} s"
        try:
            async with asyncio.timeout(timeout) as whole:
                # redirects are answers, never followed: a peer must not aim us at a third party
                async with self._session.request(method, url, data=body or None, headers=headers,
                                                 allow_redirects=False) as resp:
                    declared = resp.content_length
                    theirs = resp.headers.get(HEADER_MODEL, "")
                    if model and theirs and theirs != model:
                        raise PeerError(f"{addr}: {mismatch(theirs[:200], model)}")
                    if declared is not None and declared > limit:
                        raise PeerError(f"{addr}: body of {declared} bytes is over the limit of {limit}")
                    began = loop.time()
                    if transfer is not None:
                        seconds = transfer.deadline(limit if declared is None else declared)
                        whole.reschedule(began + seconds)
                        allowed = f"body not complete within {seconds:.1f} s"
                    got = await _read_body(resp, addr, declared, limit, transfer, spool)
                    took = loop.time() - began
                    if isinstance(got, SpooledBody):
                        return await self._spooled(got, addr, path_qs, request_sig, resp, gzip, took)
                    data = got
                    if self._secret and not await _verified(self._secret, request_sig, resp, data):
                        why = GUARD_REFUSALS.get(resp.status, "altered on the way, or not a member")
                        raise PeerError(f"{addr}{path_qs}: answer not signed with the cluster secret "
                                        f"(HTTP {resp.status}; {why})")
                    self.bytes_sent += len(body)
                    self.bytes_received += len(data)
                    wire, coding = len(data), resp.headers.get("Content-Encoding", "identity").strip().lower()
                    if coding == "gzip" and gzip:
                        data = (gunzip(data, limit) if wire <= INLINE_BYTES
                                else await asyncio.to_thread(gunzip, data, limit))
                    elif coding != "identity":
                        raise PeerError(f"{addr}{path_qs}: answer in an encoding not asked for ({coding[:40]!r})")
                    return ModelAnswer(resp.status, data, dict(resp.headers), wire, took)
        except TooSlow as exc:
            raise PeerTimeout(f"{addr}: {exc}") from exc
        except TimeoutError as exc:
            raise PeerTimeout(f"{addr}: {allowed}") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PeerError(f"{addr}: {exc.__class__.__name__}: {exc}") from exc

    async def _spooled(self, got: SpooledBody, addr: str, path_qs: str, request_sig: str,
                       resp: aiohttp.ClientResponse, gzip: bool, took: float) -> ModelAnswer:
        """A body written to a file: its signature checked against the SHA-256 taken as it was
        written, and never inflated (p2pnode gzips answers of a few MB at most, net/encoding.py:
        one as big as this is not what a node sends). The file is removed on any refusal."""
        try:
            if self._secret:
                sig = resp.headers.get(HEADER_RESPONSE_SIG)
                want = sign_response_digest(self._secret, request_sig, resp.status, got.sha256)
                if not sig or not hmac.compare_digest(want, str(sig)):
                    why = GUARD_REFUSALS.get(resp.status, "altered on the way, or not a member")
                    raise PeerError(f"{addr}{path_qs}: answer not signed with the cluster secret "
                                    f"(HTTP {resp.status}; {why})")
            coding = resp.headers.get("Content-Encoding", "identity").strip().lower()
            if coding != "identity":
                what = "a gzip answer of this size is not one p2pnode sends" if gzip and coding == "gzip" \
                    else "an encoding not asked for"
                raise PeerError(f"{addr}{path_qs}: answer of {got.nbytes} bytes in {coding[:40]!r} ({what})")
        except BaseException:
            got.close()
            raise
        self.bytes_received += got.nbytes
        return ModelAnswer(resp.status, b"", dict(resp.headers), got.nbytes, took, spooled=got)

    async def call(self, addr: str, path: str, message: dict[str, Any], timeout: float = 1.0) -> dict[str, Any]:
        """POST a msgpack message, expect 200 and a msgpack map back."""
        body = msgpack.packb(message, use_bin_type=True)
        resp = await self.request("POST", addr, path, body, timeout)
        if resp.status != 200:
            raise PeerError(f"{addr}{path}: HTTP {resp.status}: {resp.body[:200]!r}")
        try:
            reply = msgpack.unpackb(resp.body, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise PeerError(f"{addr}{path}: undecodable reply: {exc}") from exc
        if not isinstance(reply, dict):
            raise PeerError(f"{addr}{path}: reply is not a map")
        return reply


#: a model answer's header naming the fingerprint of the model it carries (``TASK@HASH``)
HEADER_MODEL = "X-P2P-Model"


class TooSlow(TimeoutError):
    """A body coming slower than its transfer's cut-off rate (a peer trickling bytes)."""


async def _read_body(resp: aiohttp.ClientResponse, addr: str, declared: int | None, limit: int,
                     transfer: Transfer | None, spool: Spool | None = None) -> Body | SpooledBody:
    """The body, read into one buffer (of the declared length when there is one: never a list
    of chunks joined at the end, which held a model twice). A model-sized one is filled in a
    thread (net/bodyfill.py: the copies and the first touch of its pages off the event loop),
    or, when ``spool`` wants it, written to a file in a thread (net/spool.py). With
    ``transfer``, a body slower than its cut-off rate over any STALL_WINDOW is cut off
    (TooSlow)."""
    fill: BodyFill | SpoolFill | None = None
    if transfer is not None and declared is not None and declared > INLINE_BYTES:
        fill = spool.fill(declared) if spool is not None and spool.wants(declared) else BodyFill(declared)
    buf = bytearray(declared or 0) if fill is None else None
    view = memoryview(buf) if declared and buf is not None else None
    got = 0
    loop = asyncio.get_running_loop()
    mark_at, mark_got = loop.time(), 0
    cutoff = transfer.cutoff if transfer is not None else 0.0
    try:
        while True:
            if transfer is not None:
                try:
                    async with asyncio.timeout(STALL_WINDOW):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    raise TooSlow(f"body stalled: nothing for {STALL_WINDOW:g} s after {got} bytes") from None
            else:
                chunk = await resp.content.readany()
            if not chunk:
                break
            n = len(chunk)
            if declared is not None and got + n > declared:
                raise PeerError(f"{addr}: body longer than its Content-Length")
            if fill is not None:
                await fill.add(chunk)
            elif view is not None:
                view[got:got + n] = chunk
            else:
                if got + n > limit:
                    raise PeerError(f"{addr}: body over the limit of {limit} bytes")
                assert buf is not None
                buf += chunk
            got += n
            now = loop.time()
            if cutoff > 0 and now - mark_at >= STALL_WINDOW:
                if (got - mark_got) / (now - mark_at) < cutoff:
                    raise TooSlow(f"body too slow: {(got - mark_got) / (now - mark_at) / 1024:.0f} KiB/s over "
                                  f"{now - mark_at:.1f} s, under {cutoff / 1024:.0f} KiB/s, after {got} bytes")
                mark_at, mark_got = now, got
        if declared is not None and got != declared:
            raise PeerError(f"{addr}: body of {got} bytes, {declared} declared")
        if fill is not None:
            return await fill.finish()
    except BaseException:
        if fill is not None:
            fill.abandon()
        raise
    finally:
        if view is not None:
            view.release()
    assert buf is not None
    return buf


async def _verified(secret: bytes, request_sig: str, resp: aiohttp.ClientResponse,
                    data: bytes | bytearray | memoryview) -> bool:
    """Whether the answer's signature matches (its body hashed in a thread when long)."""
    sig = resp.headers.get(HEADER_RESPONSE_SIG)
    if not sig:
        return False
    if len(data) <= INLINE_BYTES:
        want = sign_response(secret, request_sig, resp.status, data)
    else:
        want = await asyncio.to_thread(sign_response, secret, request_sig, resp.status, data)
    return hmac.compare_digest(want, str(sig))
