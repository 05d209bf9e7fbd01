"""Server-side pieces shared by every endpoint: signature checking and msgpack handlers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

from p2pnode.net.auth import (
    HEADER_RESPONSE_SIG,
    HEADER_SIG,
    HEADER_TS,
    ReplayCache,
    sign_response,
    sign_response_digest,
    verify,
)
from p2pnode.net.stream import PartsResponse
from p2pnode.net.client import INLINE_BYTES, MSGPACK

log = logging.getLogger("p2pnode.http")

#: paths that answer without a signature: health checks and scraping come from outside the cluster
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
#: request key set by a middleware ahead of this one (the dashboard's read-only token) when the
#: request is authorised for what it asks; such a request needs no signature
TOKEN_AUTHORIZED = "p2pnode.token_authorized"
MAX_MESSAGE = 1024 * 1024  # membership and control messages are small

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def auth_middleware(secret: bytes, max_body: int | Callable[[web.Request], int] | None = None,
                    on_reject: Callable[[str], None] | None = None) -> Any:
    """Reject unsigned, badly signed or replayed requests before any body is decoded, and sign
    every answer to a signed request (``X-P2P-Response-Signature``, p2pnode.net.auth).

    A request with no signature headers, or declaring a body over ``max_body``, is refused from
    its headers alone, before its body is read. A request stamped before this middleware was made
    (the server's start, less ``auth.START_SKEW``) is refused as a replay: the replay cache,
    in memory, cannot tell whether the server's previous life took it. ``on_reject(reason)`` ("unauthorized",
    "replayed", "too-large") lets the caller count refusals.
    """

    def refuse(status: int, reason: str, message: str) -> web.Response:
        if on_reject is not None:
            on_reject(reason)
        return error(status, message)

    replays = ReplayCache()

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.get(TOKEN_AUTHORIZED):
            return await handler(request)
        if not (request.headers.get(HEADER_SIG) and request.headers.get(HEADER_TS)):
            return refuse(401, "unauthorized", "missing or bad signature")
        most = max_body(request) if callable(max_body) else max_body
        if most is not None and request.content_length is not None and request.content_length > most:
            return refuse(413, "too-large", f"body over {most} bytes")
        try:
            body = await request.read()  # read already by the guard, under the endpoint's limit
        except web.HTTPRequestEntityTooLarge:
            return refuse(413, "too-large", f"body over {request.client_max_size} bytes")
        # a model-sized body (a pushed model) is hashed in a thread: hashlib lets go of the GIL
        ok = (verify(secret, request.method, request.path_qs, body, request.headers) if len(body) <= INLINE_BYTES
              else await asyncio.to_thread(verify, secret, request.method, request.path_qs, body, request.headers))
        if not ok:
            return refuse(401, "unauthorized", "missing or bad signature")
        request_sig = request.headers[HEADER_SIG]
        if not replays.fresh(request_sig, int(request.headers[HEADER_TS])):
            return refuse(401, "replayed", "request seen before, or signed before this node started (replayed)")
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # aiohttp 3: an answer raised, signed like any other
            raw_exc = exc.body
            if isinstance(raw_exc, (bytes, bytearray)) or raw_exc is None:
                exc.headers[HEADER_RESPONSE_SIG] = sign_response(secret, request_sig, exc.status, bytes(raw_exc or b""))
            raise
        if isinstance(resp, web.Response):
            raw = resp.body
            if isinstance(raw, (bytes, bytearray)) or raw is None:
                resp.headers[HEADER_RESPONSE_SIG] = sign_response(secret, request_sig, resp.status, bytes(raw or b""))
        elif isinstance(resp, PartsResponse) and not resp.prepared:  # its body hashed off the loop
            digest = await asyncio.to_thread(resp.body_sha256)
            resp.headers[HEADER_RESPONSE_SIG] = sign_response_digest(secret, request_sig, resp.status, digest)
        return resp  # any other streamed answer goes unsigned, and a client with the secret refuses it

    return middleware


def unsigned_refusal(on_reject: Callable[[str], None] | None = None) -> Callable[[web.Request], web.Response | None]:
    """For the guard's precheck: 401 for a request that needs a signature and carries none,
    decided from its headers, before its body is read."""

    def precheck(request: web.Request) -> web.Response | None:
        if request.path in OPEN_PATHS or request.get(TOKEN_AUTHORIZED):
            return None
        if request.headers.get(HEADER_SIG) and request.headers.get(HEADER_TS):
            return None
        if on_reject is not None:
            on_reject("unauthorized")
        return error(401, "missing or bad signature")

    return precheck


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def msgpack_handler(fn: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]) -> Handler:
    """Turn ``async fn(message) -> reply`` into a handler: strict decoding, 400 on bad input."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > MAX_MESSAGE:
            return error(413, f"message over {MAX_MESSAGE} bytes")
        body = await request.read()
        if len(body) > MAX_MESSAGE:
            return error(413, f"message over {MAX_MESSAGE} bytes")
        try:
            msg = msgpack.unpackb(body, raw=False, strict_map_key=True, max_bin_len=MAX_MESSAGE,
                                  max_str_len=MAX_MESSAGE, max_array_len=65536, max_map_len=65536)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            return error(400, f"undecodable message: {exc.__class__.__name__}")
        if not isinstance(msg, dict):
            return error(400, "message must be a map")
        try:
            reply = await fn(msg)
        except ValueError as exc:
            return error(400, str(exc))
        return web.Response(body=msgpack.packb(reply, use_bin_type=True), content_type=MSGPACK)

    return handler
