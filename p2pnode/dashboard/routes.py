"""The web dashboard every node serves at ``GET /``, and the read-only access that guards it.

Routes added to the node's app by ``install`` (the one call ``Node.run`` makes):

- ``GET /``: the page; ``GET /static/NAME``: its script, style sheet and icon. All of it is
  package data (``p2pnode/dashboard/static/``), written in this project with no library: plain
  JavaScript drawing SVG. Nothing is fetched from anywhere but this node (the page's
  Content-Security-Policy says ``'self'`` only).
- ``GET /v1/history?since=SEQ``: this node's charts (``history.History``, sampled once a second).
- ``GET /v1/cluster``: every member's figures and the exchange graph (``cluster.ClusterView``).

Access. Without a cluster secret everything is open, like ``/v1/status``. With one, peers keep
signing with HMAC; a browser cannot, so these GET paths (and ``/v1/status``) also take a
read-only credential: the ``node.dashboard_token`` (or ``dashboard_token_file``) or the secret
itself, given as ``/?token=...`` (answered with a cookie and a redirect that drops it from the
address bar), HTTP basic (any user name, the token as password: the browser asks for it), or
``Authorization: Bearer``. The cookie holds an HMAC of the credential, never the credential,
so a cookie taken from a browser does not reveal the secret. The token opens nothing else:
``/v1/model`` and membership still need a signature.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from p2pnode.config import Config
from p2pnode.config.mode_rule import sync_of
from p2pnode.dashboard.cluster import ClusterLimits, ClusterView, advise
from p2pnode.dashboard.history import History
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.membership.base import Membership
from p2pnode.net.auth import HEADER_SIG
from p2pnode.net.client import PeerClient
from p2pnode.net.server import TOKEN_AUTHORIZED, Handler, error

log = logging.getLogger("p2pnode.dashboard")

#: the page's files and their content types; nothing else under /static/ is served
ASSETS = {"index.html": "text/html", "dashboard.js": "text/javascript", "dashboard.css": "text/css",
          "favicon.svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: paths a read-only token opens (GET and HEAD only)
TOKEN_PATHS = frozenset({"/", "/v1/status", "/v1/history", "/v1/cluster"})
COOKIE_LABEL = b"p2pnode dashboard cookie"


def finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities replaced by None: JSON has no such numbers, and a browser's
    ``response.json()`` refuses a document that carries one (Python's ``json`` writes them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_response(obj: Any) -> web.Response:
    return web.json_response(finite(obj), dumps=lambda o: json.dumps(o, allow_nan=False, default=str))


class NodeLike(Protocol):
    """What the dashboard reads of ``daemon.node.Node``."""

    cfg: Config
    secret: bytes | None
    node_id: str
    client: PeerClient
    metrics: NodeMetrics
    membership: Membership | None

    def status(self) -> dict[str, Any]: ...


def read_token(cfg: Config) -> bytes | None:
    """The read-only dashboard token from the config (file wins), or None."""
    if cfg.node.dashboard_token_file:
        return Path(cfg.node.dashboard_token_file).read_bytes().strip() or None
    return cfg.node.dashboard_token.encode() or None


def load_assets() -> dict[str, bytes]:
    """The page's files from package data; a missing one is logged (the page then answers 500)."""
    folder = resources.files("p2pnode.dashboard").joinpath("static")
    out: dict[str, bytes] = {}
    for name in ASSETS:
        try:
            out[name] = folder.joinpath(name).read_bytes()
        except OSError as exc:
            log.error("dashboard asset %s missing from this install: %s", name, exc)
    return out


class DashboardAuth:
    """Checks the read-only credentials a browser can present; HMAC stays the auth middleware's."""

    def __init__(self, credentials: list[bytes], cookie_name: str, secure: bool,
                 on_reject: Callable[[str], None] | None = None) -> None:
        self.credentials = [c for c in credentials if c]
        self.cookies = [self.cookie_value(c) for c in self.credentials]
        self.cookie_name = cookie_name
        self.secure = secure
        self.on_reject = on_reject

    @staticmethod
    def cookie_value(credential: bytes) -> str:
        return hmac.new(credential, COOKIE_LABEL, hashlib.sha256).hexdigest()

    def _known(self, presented: str) -> bool:
        raw = presented.encode()
        return any(hmac.compare_digest(raw, c) for c in self.credentials)

    def presented_ok(self, request: web.Request) -> bool:
        cookie = request.cookies.get(self.cookie_name, "")
        if cookie and any(hmac.compare_digest(cookie, c) for c in self.cookies):
            return True
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value:
            return self._known(value.strip())
        if scheme.lower() == "basic" and value:
            try:
                _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return self._known(password)
        return False

    @staticmethod
    def applies(request: web.Request) -> bool:
        path = request.path
        return request.method in ("GET", "HEAD") and (path in TOKEN_PATHS or path.startswith("/static/"))

    def middleware(self) -> Any:
        @web.middleware
        async def dashboard_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not self.applies(request):
                return await handler(request)
            token = request.query.get("token")
            if token is not None:
                if not self._known(token):
                    return self.refuse("bad token")
                # Trade the token in the address for a cookie, and drop it from the address bar.
                query = {k: v for k, v in request.query.items() if k != "token"}
                resp = web.HTTPSeeOther(request.rel_url.with_query(query))
                resp.set_cookie(self.cookie_name, self.cookie_value(token.encode()), httponly=True,
                                samesite="Strict", secure=self.secure, path="/")
                return resp
            if self.presented_ok(request):
                request[TOKEN_AUTHORIZED] = True
                return await handler(request)
            if request.headers.get(HEADER_SIG):
                return await handler(request)  # a peer's signed request: the auth middleware checks it
            return self.refuse("missing or bad token")

        return dashboard_auth

    def refuse(self, message: str) -> web.Response:
        if self.on_reject is not None:
            self.on_reject("unauthorized")
        resp = error(401, f"{message}: open /?token=TOKEN once, or sign in with the dashboard token as password")
        resp.headers["WWW-Authenticate"] = 'Basic realm="p2pnode dashboard", charset="UTF-8"'
        return resp


class Dashboard:
    def __init__(self, history: History, cluster: ClusterView, assets: dict[str, bytes]) -> None:
        self.history = history
        self.cluster = cluster
        self.assets = assets

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.get_page)
        app.router.add_get("/static/{name}", self.get_asset)
        app.router.add_get("/v1/history", self.get_history)
        app.router.add_get("/v1/cluster", self.get_cluster)

    def _file(self, name: str) -> web.Response:
        body = self.assets.get(name)
        if body is None:
            return error(500 if name in ASSETS else 404, f"no dashboard asset {name!r} in this install")
        return web.Response(body=body, content_type=ASSETS[name],
                            headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP,
                                     "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    async def get_page(self, request: web.Request) -> web.StreamResponse:
        return self._file("index.html")

    async def get_asset(self, request: web.Request) -> web.StreamResponse:
        return self._file(request.match_info["name"])

    async def get_history(self, request: web.Request) -> web.StreamResponse:
        raw = request.query.get("since", "0") or "0"
        if not raw.isdigit() or len(raw) > 18:
            return error(400, "since must be a non-negative integer")
        return json_response(self.history.to_json(int(raw)))

    async def get_cluster(self, request: web.Request) -> web.StreamResponse:
        return json_response(await self.cluster.get())


def install(app: web.Application, node: NodeLike) -> Dashboard:
    """Add the dashboard's routes and access check to ``app`` and run its history actor with it
    (and, in gossip mode, the advice read once from the cluster view: ``cluster.advise``).

    The sampler starts with the app (``runner.setup()``) and is cancelled at ``runner.cleanup()``;
    with a secret the token check goes first among the middlewares, ahead of the HMAC check.
    """
    assert node.membership is not None
    membership = node.membership
    history = History(node.status)
    view = ClusterView(node.node_id, node.status, membership.members, node.client, ClusterLimits())
    dashboard = Dashboard(history, view, load_assets())
    dashboard.add_routes(app)
    if node.secret:
        token = read_token(node.cfg)
        auth = DashboardAuth([c for c in (token, node.secret) if c], f"p2pnode_{node.node_id}",
                             secure=bool(node.cfg.node.tls_cert),
                             on_reject=lambda reason: node.metrics.rejected.labels(reason).inc())
        app.middlewares.insert(0, auth.middleware())

    def has_peers() -> bool:
        return any(m.node_id != node.node_id and str(m.state) == "alive" for m in membership.members())

    async def sampler(_app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(history.run(), name="history")]
        if sync_of(node.cfg) == "none" and node.cfg.node.role == "peer":  # gossip: the advice's case
            tasks.append(asyncio.create_task(advise(view, has_peers), name="advise"))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)

    app.cleanup_ctx.append(sampler)
    return dashboard
