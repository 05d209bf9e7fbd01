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
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack

from p2pnode.net.auth import HEADER_SIG, sign, verify_response
from p2pnode.net.encoding import gunzip, with_gzip_marker

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


class PeerClient:
    def __init__(self, secret: bytes | None = None, ssl: Any = None, max_body: int = 512 * 1024 * 1024,
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
                      content_type: str = MSGPACK, gzip: bool = False) -> Response:
        """Send one request; raise PeerError on any failure, timeout included. ``gzip``: a gzip
        answer is welcome (and inflated); without it none is asked for and one is refused."""
        self.open()
        assert self._session is not None
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
        try:
            async with asyncio.timeout(timeout):
                # redirects are answers, never followed: a peer must not aim us at a third party
                async with self._session.request(method, url, data=body or None, headers=headers,
                                                 allow_redirects=False) as resp:
                    declared = resp.content_length
                    if declared is not None and declared > self._max_body:
                        raise PeerError(f"{addr}: body of {declared} bytes is over the limit")
                    chunks, total = [], 0
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        total += len(chunk)
                        if total > self._max_body:
                            raise PeerError(f"{addr}: body over the limit of {self._max_body} bytes")
                        chunks.append(chunk)
                    data = b"".join(chunks)
                    if self._secret and not verify_response(self._secret, request_sig, resp.status, data,
                                                            resp.headers):
                        raise PeerError(f"{addr}{path_qs}: answer not signed with the cluster secret "
                                        f"(HTTP {resp.status}; altered on the way, or not a member)")
                    self.bytes_sent += len(body)
                    self.bytes_received += len(data)
                    wire, coding = len(data), resp.headers.get("Content-Encoding", "identity").strip().lower()
                    if coding == "gzip" and gzip:
                        data = gunzip(data, self._max_body)
                    elif coding != "identity":
                        raise PeerError(f"{addr}{path_qs}: answer in an encoding not asked for ({coding[:40]!r})")
                    return Response(resp.status, data, dict(resp.headers), wire)
        except TimeoutError as exc:
            raise PeerTimeout(f"{addr}: no answer within {timeout:g} s") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise PeerError(f"{addr}: {exc.__class__.__name__}: {exc}") from exc

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
