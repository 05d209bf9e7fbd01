"""How SWIM messages travel: a request/reply ``Transport`` and its HTTP implementation.

Every SWIM exchange is one request and one reply (ping/ack, ping-req/ack-or-nack,
gossip/ack, push-pull/push-pull), so the transport is a single ``send(addr, msg, timeout)``.
Both directions share one codec (``handle_bytes``): msgpack with tight container limits,
a byte bound per message type, then the protocol's strict decoding. ``HttpTransport`` posts
to ``/v1/membership/<type>`` through the node's keep-alive ``PeerClient``; the in-memory
transport of benchlib/swim_sim.py goes through the very same ``handle_bytes``.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from p2pnode.membership.swim.messages import MAX_RECORDS, REQUEST_TYPES, MessageError
from p2pnode.net.client import MSGPACK, PeerClient, PeerError

PREFIX = "/v1/membership/"

#: handler(request, origin) -> reply; origin is the sender's host as the transport saw it (None when
#: the transport cannot tell), which per-source bounds count instead of the id a message claims
Handler = Callable[[dict[str, Any], str | None], Awaitable[dict[str, Any]]]
#: observer(direction, message type, bytes): direction is "sent" or "received"
Observer = Callable[[str, str, int], None]


class TransportError(PeerError):
    """The message or its reply did not get through (timeout, unreachable, refused, garbage)."""


def pack(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(data: bytes, limit: int) -> dict[str, Any]:
    """Decode a msgpack map of at most ``limit`` bytes; MessageError otherwise."""
    if len(data) > limit:
        raise MessageError(f"message of {len(data)} bytes is over the limit of {limit}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=limit, max_bin_len=0,
                              max_ext_len=0, max_array_len=MAX_RECORDS, max_map_len=32)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MessageError(f"undecodable message: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise MessageError("message must be a map")
    return obj


class Transport(abc.ABC):
    """Carries membership messages; subclasses implement ``send`` and deliver to ``handle_bytes``."""

    def __init__(self) -> None:
        self._handler: Handler | None = None
        self._observer: Observer | None = None
        self.max_message_bytes = 64 * 1024
        self.max_push_pull_bytes = 4 * 1024 * 1024

    def bind(self, handler: Handler, *, observer: Observer | None = None, max_message_bytes: int = 64 * 1024,
             max_push_pull_bytes: int = 4 * 1024 * 1024) -> None:
        """Attach the protocol: ``handler(request, origin) -> reply`` for inbound messages."""
        self._handler = handler
        self._observer = observer
        self.max_message_bytes = max_message_bytes
        self.max_push_pull_bytes = max_push_pull_bytes

    def limit(self, msg_type: str) -> int:
        return self.max_push_pull_bytes if msg_type == "push-pull" else self.max_message_bytes

    def _observe(self, direction: str, msg_type: str, size: int) -> None:
        if self._observer is not None:
            self._observer(direction, msg_type, size)

    def encode_request(self, msg: dict[str, Any]) -> bytes:
        data = pack(msg)
        if len(data) > self.limit(msg["t"]):
            raise TransportError(f"{msg['t']} message of {len(data)} bytes is over the limit")
        self._observe("sent", msg["t"], len(data))
        return data

    def decode_reply(self, request_type: str, data: bytes) -> dict[str, Any]:
        try:
            reply = unpack(data, self.limit(request_type))
        except MessageError as exc:
            raise TransportError(f"bad {request_type} reply: {exc}") from None
        self._observe("received", str(reply.get("t", "?"))[:16], len(data))
        return reply

    async def handle_bytes(self, path_type: str, body: bytes, origin: str | None = None) -> bytes:
        """Serve one inbound request: bounded decode, protocol handler, encode the reply.

        Raises MessageError for malformed input (HTTP answers 400).
        """
        if self._handler is None:
            raise MessageError("membership is not running here")
        if path_type not in REQUEST_TYPES:
            raise MessageError(f"unknown membership request {path_type!r:.40}")
        msg = unpack(body, self.limit(path_type))
        if msg.get("t") != path_type:
            raise MessageError(f"{path_type} endpoint got a {msg.get('t')!r:.20} message")
        self._observe("received", path_type, len(body))
        reply_msg = await self._handler(msg, origin)
        reply = pack(reply_msg)
        self._observe("sent", str(reply_msg.get("t", "?")), len(reply))
        return reply

    @abc.abstractmethod
    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``msg`` (an encoded message map) to ``addr``; return the reply map.

        Raises PeerError (TransportError or the client's) on timeout or any failure.
        """

    def add_routes(self, app: web.Application) -> None:
        """Register inbound endpoints on an aiohttp app (transports that serve HTTP)."""


async def read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit``: a declared length
    is refused before reading, a chunked body while streaming, never read whole first."""
    if request.content_length is not None and request.content_length > limit:
        return None
    if request.content.at_eof():  # nothing left to stream: empty, or read already (signature check)
        body = await request.read()
        return body if len(body) <= limit else None
    buf = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            return None
    return bytes(buf)


class HttpTransport(Transport):
    """Membership over the daemon's HTTP server and shared keep-alive client.

    Signatures (when a cluster secret is set) are added by the client and checked by the
    daemon's middleware before any handler runs.
    """

    def __init__(self, client: PeerClient) -> None:
        super().__init__()
        self.client = client

    async def send(self, addr: str, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        msg_type = msg["t"]
        body = self.encode_request(msg)
        resp = await self.client.request("POST", addr, PREFIX + msg_type, body, timeout)
        if resp.status != 200:
            raise TransportError(f"{addr}{PREFIX}{msg_type}: HTTP {resp.status}: {resp.body[:200]!r}")
        return self.decode_reply(msg_type, resp.body)

    def add_routes(self, app: web.Application) -> None:
        for msg_type in REQUEST_TYPES:
            app.router.add_post(PREFIX + msg_type, self._endpoint(msg_type))

    def _endpoint(self, msg_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        limit = self.limit

        async def endpoint(request: web.Request) -> web.Response:
            body = await read_at_most(request, limit(msg_type))
            if body is None:
                return web.json_response({"error": f"message over {limit(msg_type)} bytes"}, status=413)
            try:
                reply = await self.handle_bytes(msg_type, body, request.remote)
            except MessageError as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.Response(body=reply, content_type=MSGPACK)

        return endpoint
