"""The node's HTTP API (aiohttp): model exchange, status, metrics, health.

``GET /v1/model`` serves this node's public model (sparse delta since a version, a snapshot, or
304); ``POST /v1/model`` lets a member push a payload to be averaged in (anyone else: 403 from
the headers, p2pnode/daemon/push.py). Every request passes the
guard first (``p2pnode.net.guard``: a rate per client IP, 429 beyond; bodies read streaming
under the endpoint's limit, 413 as soon as one passes it; bounded concurrent body reads and
bytes, 503 beyond). A POST /v1/model body (and a mode's model-sized route's) may be as large
as a payload of this model can be (``http.max_payload_bytes`` caps it where set, as it caps a
fetched one; it is read into one buffer in a thread); a payload the worker refuses
gets 400 (malformed), 409 (no replica to apply a delta to) or 422 (another architecture,
non-finite values), and changes nothing. A bad query (``?since=abc``, no ``?from=``) gets 400.
Every refusal is counted in ``p2pnode_payloads_rejected_total`` by reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from p2pnode.config import Config
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.daemon.push import PUSH_PATH, PushPolicy
from p2pnode.daemon.state import ModelSource
from p2pnode.membership.base import Member
from p2pnode.net.client import HEADER_MODEL, MSGPACK
from p2pnode.net.encoding import MAX_BYTES as GZIP_MAX
from p2pnode.net.encoding import asks_for_gzip, gzip_if_smaller
from p2pnode.net.guard import BodyBudget, GuardLimits, TokenBuckets, guard_middleware
from p2pnode.net.stream import SLICE, PartsResponse, sha256_of
from p2pnode.net.server import MAX_MESSAGE, auth_middleware, error, unsigned_refusal
from p2pnode.pipe_protocol import PublishNow
from p2pnode.wire.codec import payload_limit
from p2pnode.wire.genesis import DIGEST_RE
from p2pnode.wire.prefix import prefix_error
from p2pnode.wire.served import ServedModel

log = logging.getLogger("p2pnode.http")

#: largest membership bodies the guard reads (each endpoint checks its own limit again): SWIM's
#: push-pull and the simple protocol's messages, and every other SWIM message (SwimConfig's
#: max_push_pull_bytes and max_message_bytes)
MEMBERSHIP_BODY = {"push-pull": 4 * 1024 * 1024, "join": MAX_MESSAGE, "sync": MAX_MESSAGE, "leave": MAX_MESSAGE}
SWIM_MESSAGE_BODY = 64 * 1024

REFUSAL_STATUS = {"malformed": 400, "gap": 409, "architecture": 422, "non-finite": 422, "outlier": 422}
#: compression.publish_on = "fetch": the longest a fetch waits for our worker's publish (s)
FRESH_WAIT = 0.5
#: requests' worth of per-address rate a per-step route costs (``PostRoutes.per_step``): with
#: the default 100 a second, 1000 a second from one address, 500 steps a second of its nodes
PER_STEP_COST = 0.1


@dataclass(frozen=True)
class PostRoutes:
    """How the guard treats a mode's POST routes (p2pnode/daemon/mode.py), beside POST /v1/model."""

    #: taken from running members only, sent from their host (the push check, daemon/push.py)
    members_only: tuple[str, ...] = ()
    #: bodies as large as a model payload may be (``HttpApi.post_limit``)
    model_sized: tuple[str, ...] = ()
    #: bodies that must begin a model payload of this node's model (wire/prefix.py)
    payloads: tuple[str, ...] = ()
    #: routes whose member check is left to their handler until this node has joined: a
    #: restarted node knows few members then (the synchronous mode's contributions)
    checked_after_join: tuple[str, ...] = ()
    #: routes a member calls at every training step (the synchronous mode's contributions, two a
    #: step): each costs PER_STEP_COST of a request in the per-address rate, so that nodes behind
    #: one address (one host, a NAT) stepping fast are not refused with 429 mid-round. Measured:
    #: three nodes of a small regression task on one host were refused at 100 requests a second
    per_step: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeView:
    """What the API reads of the node beyond its model and worker (each a callable: read when
    a request comes)."""

    #: while true, GET /v1/model answers 503: a fresh node whose start is not settled yet
    #: serves no model, so its untrained one is nobody's start nor averaged in (exchange/bootstrap.py)
    starting: Callable[[], bool] = lambda: False
    #: whether our worker is taking local steps (compression.publish_on = "fetch" asks it to
    #: publish before answering a fetch only then)
    training: Callable[[], bool] = lambda: False
    #: exchange.max_lead: a member's fetch says its step (``&step=``); the exchange keeps it
    heard_step: Callable[[str, int], None] = lambda node, step: None
    #: our worker's step now (each model answer says it, 304s included)
    step_now: Callable[[], int] = lambda: -1
    #: whether this node has joined its cluster (``PostRoutes.checked_after_join``)
    joined: Callable[[], bool] = lambda: True


def _query(request: web.Request, key: str, valid: Callable[[str], bool], what: str) -> str | None:
    """The query parameter ``key`` (None when absent or empty); 400 saying ``what`` it must be
    when ``valid`` refuses it."""
    raw = request.query.get(key)
    if raw is None or raw == "":
        return None
    if not valid(raw):
        raise web.HTTPBadRequest(text=json.dumps({"error": f"{key} must be {what}"}),
                                 content_type="application/json")
    return raw


def parse_step(text: str) -> int | None:
    """A step as a peer sends it (header or query: decimal digits), or None for anything else."""
    return int(text) if text.isdigit() and len(text) <= 18 else None


def _nonneg_int(request: web.Request, key: str) -> int | None:
    raw = _query(request, key, lambda r: r.isdigit() and len(r) <= 18, "a non-negative integer")
    return None if raw is None else int(raw)


def _digest(request: web.Request, key: str) -> str | None:
    return _query(request, key, lambda r: DIGEST_RE.fullmatch(r) is not None, "32 lowercase hex digits")


class HttpApi:
    def __init__(self, cfg: Config, model: ModelSource, worker: WorkerPipe, metrics: NodeMetrics,
                 status: Callable[[], dict[str, Any]], healthy: Callable[[], bool],
                 pusher: Callable[[str], Member | None], view: NodeView = NodeView(),
                 routes: PostRoutes = PostRoutes()) -> None:
        self.cfg = cfg
        self.model = model  # what GET /v1/model serves
        self.worker = worker  # where POST /v1/model payloads go
        self.metrics = metrics
        self.status = status
        self.healthy = healthy
        #: model payload bytes this node has served (status shows it; metrics count it too)
        self.bytes_served = 0
        #: the last body gzipped for an answer and its gzip (None: not smaller): GET /v1/model
        self._gzipped: tuple[bytes | bytearray | memoryview | None, bytes | None] = (None, None)
        self.rate_buckets: TokenBuckets | None = None  # set by build_app
        self.body_budget: BodyBudget | None = None
        #: full snapshots cost a whole model each: their own, smaller rate per client IP
        self.snapshot_buckets = TokenBuckets(cfg.http.snapshot_rate_per_source, cfg.http.snapshot_burst)
        self.view = view
        self.routes = routes
        #: who may POST /v1/model and the mode's members-only routes (exchange.accept_pushes);
        #: ``pusher`` is the membership's
        self.pushes = PushPolicy(cfg.exchange.accept_pushes, pusher, self._count_rejected,
                                 (PUSH_PATH, *routes.members_only))
        #: pushed payloads the worker averaged in
        self.pushes_accepted = 0

    def _count_rejected(self, reason: str) -> None:
        self.metrics.rejected.labels(reason).inc()

    def post_limit(self) -> int:
        """The largest POST /v1/model body (and a mode's model-sized one): as large as a
        payload of this model can be (a delta naming every element, wire/codec.py
        payload_limit), capped by ``http.max_payload_bytes`` where set, as a fetched payload
        is; not by ``http.max_request_bytes``, a fixed size that refused every push of a model
        over 8M parameters. Before the model is known, ``http.max_request_bytes``."""
        served = self.model.served
        if served is None:
            return self.cfg.http.max_request_bytes
        return payload_limit(served.spec, self.cfg.http.max_payload_bytes)

    def body_limit(self, request: web.Request) -> int:
        """The largest body the endpoint of ``request`` takes (the guard reads no more)."""
        if request.path == PUSH_PATH or request.path in self.routes.model_sized:
            return self.post_limit()
        if request.path.startswith("/v1/membership/"):
            limit = MEMBERSHIP_BODY.get(request.path.removeprefix("/v1/membership/"), SWIM_MESSAGE_BODY)
        else:
            limit = MAX_MESSAGE
        return min(limit, self.cfg.http.max_request_bytes)

    def body_prefix_error(self, request: web.Request, prefix: bytes) -> str | None:
        """For POST /v1/model: why the body's first bytes cannot begin a payload of this model."""
        served = self.model.served
        if (request.path != PUSH_PATH and request.path not in self.routes.payloads) or served is None:
            return None
        return prefix_error(prefix, served.spec)

    def build_app(self, secret: bytes | None) -> web.Application:
        h = self.cfg.http
        limits = GuardLimits(h.rate_per_source, h.rate_burst, h.max_body_reads, h.max_inflight_bytes)
        count = self._count_rejected
        unsigned = unsigned_refusal(count) if secret else None

        def precheck(request: web.Request) -> web.Response | None:
            """From the headers alone: unsigned (401), then a push from a non-member (403)."""
            refusal = unsigned(request) if unsigned is not None else None
            if refusal is None and request.path in self.routes.checked_after_join and not self.view.joined():
                return None  # checked once we have joined, by the route's handler
            return refusal if refusal is not None else self.pushes.precheck(request)

        guard, self.rate_buckets, self.body_budget = guard_middleware(
            limits, self.body_limit, count, precheck, self.body_prefix_error,
            {path: PER_STEP_COST for path in self.routes.per_step})
        middlewares = [guard]
        if secret:
            middlewares.append(auth_middleware(secret, self.body_limit, count))
        app = web.Application(client_max_size=h.max_request_bytes, middlewares=middlewares)
        app.router.add_get("/v1/model", self.get_model)
        app.router.add_post("/v1/model", self.post_model)
        app.router.add_get("/v1/status", self.get_status)
        app.router.add_get("/metrics", self.get_metrics)
        app.router.add_get("/healthz", self.get_health)
        return app

    async def get_model(self, request: web.Request) -> web.StreamResponse:
        try:
            since = _nonneg_int(request, "since")
            genesis = _digest(request, "genesis")  # the asker's version 0 (wire/genesis.py)
        except web.HTTPBadRequest:
            self.metrics.rejected.labels("bad-request").inc()
            raise
        epoch = request.query.get("epoch") or None
        served = self.model.served
        if served is None:
            return error(503, "model not ready")
        if self.view.starting():
            return error(503, "starting: this node takes its peers' model first")
        member = self.pushes.from_member(request)
        if member and (asker_step := parse_step(request.query.get("step", ""))) is not None:
            self.view.heard_step(request.query.get("from", ""), asker_step)
        if self.cfg.compression.publish_on == "fetch" and self.view.training() and member:
            served = await self.publish_first(served)
            if served is None:
                return error(503, "model not ready")
        result = served.serve_now(since, epoch, genesis)  # 304 or newest delta: no thread hop
        hold = self.cfg.http.not_modified_hold
        if result is not None and result.status == 304 and hold > 0:
            # Nothing new: hold the answer until the next publish (or ``hold`` seconds), so a
            # peer polling flat out costs one request per publish, not thousands a second.
            await self.model.wait_published(result.version, served.epoch, hold)
            served = self.model.served
            if served is None:
                return error(503, "model not ready")
            result = served.serve_now(since, epoch, genesis)
        if result is None:
            try:
                result = await asyncio.to_thread(served.serve, since, epoch, request.query.get("chain") == "1",
                                                 genesis)
            except OSError as exc:  # a big model's snapshot is written to a file first: a full disk
                log.warning("could not prepare a snapshot to serve: %s", exc)
                return error(503, f"this node could not prepare its model just now ({exc.strerror or exc})")
        if result.status == 503:
            return error(503, "nothing published yet")
        if result.kind == "snapshot" and self.snapshot_buckets.take(request.remote or "?") > 0:
            self.metrics.rejected.labels("rate-limited").inc()
            return web.json_response({"error": "too many full snapshots to this address; fetch deltas (?since=)"},
                                     status=429, headers={"Retry-After": "1"})
        headers = {"X-P2P-Version": str(result.version), "X-P2P-Kind": result.kind,
                   "X-P2P-Step": str(self.view.step_now()),  # for the asker's exchange.max_lead
                   HEADER_MODEL: served.spec.fingerprint}  # another task's asker refuses it unread
        self.metrics.requests_served.labels(result.kind if result.status == 200 else "not_modified").inc()
        if result.status == 304:
            return web.Response(status=304, headers=headers)
        if result.snapshot is not None and result.nbytes > GZIP_MAX:  # streamed from its parts (net/stream.py)
            self.bytes_served += result.nbytes
            self.metrics.bytes_served.inc(result.nbytes)
            return PartsResponse(result.snapshot.parts, result.snapshot.sha256, headers=headers, content_type=MSGPACK)
        body = result.body
        if asks_for_gzip(request.query, request.headers.get("Accept-Encoding", "")):
            packed = await self.gzipped(body)
            if packed is not None:
                body = packed
                headers["Content-Encoding"] = "gzip"
        self.bytes_served += len(body)
        self.metrics.bytes_served.inc(len(body))
        if len(body) > SLICE:  # a big delta: written a slice at a time, not copied whole on the loop
            return PartsResponse([body], lambda: sha256_of([body]), headers=headers, content_type=MSGPACK)
        return web.Response(body=body, content_type=MSGPACK, headers=headers)

    async def gzipped(self, body: bytes | bytearray | memoryview) -> bytes | None:
        """``body`` in gzip where that is smaller (net/encoding.py); the last one is kept, since
        the newest delta is what most fetches get. Bodies over 64 KiB are packed off the loop."""
        if self._gzipped[0] is body:
            return self._gzipped[1]
        packed = gzip_if_smaller(body) if len(body) <= 1 << 16 else await asyncio.to_thread(gzip_if_smaller, body)
        self._gzipped = (body, packed)
        return packed

    async def publish_first(self, served: ServedModel) -> ServedModel | None:
        """compression.publish_on = "fetch": our worker publishes what changed since its last
        publish (between two steps; nothing if it took no step since), and the fetch is answered
        from that, so the peer averages in our model as it is now: a copy a few steps stale costs
        accuracy on skewed shards (docs/ALGORITHMS.md). Only for a member's fetch
        (``PushPolicy.from_member``): a stranger polling cannot make the worker publish every
        step. At most ``FRESH_WAIT`` s of waiting: a
        worker in a long step is answered from the copy there is."""
        try:
            # bounded too: the pipe may be busy carrying a big payload to our worker for seconds
            async with asyncio.timeout(FRESH_WAIT):
                await self.worker.send(PublishNow())
        except (ConnectionError, OSError, TimeoutError):  # restarting, or busy: serve what there is
            return served
        await self.model.wait_published(served.version, served.epoch, min(FRESH_WAIT, self.cfg.exchange.timeout / 4))
        return self.model.served

    async def post_model(self, request: web.Request) -> web.StreamResponse:
        limit = self.post_limit()
        if request.content_length is not None and request.content_length > limit:
            self.metrics.rejected.labels("too-large").inc()
            return error(413, f"body over {limit} bytes")
        peer = request.query["from"]  # well formed, and a member's unless "any": the guard's precheck
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.rejected.labels("too-large").inc()
            return error(413, f"body over {limit} bytes")
        if self.model.served is None:
            return error(503, "model not ready")
        try:
            # a big model's payload crosses the pipe and is applied between two steps: 30 s and
            # a second more per 4 MB (the exchange's deliver_timeout)
            applied = await self.worker.deliver(peer, body, timeout=30.0 + len(body) / 4e6)
        except (TimeoutError, ConnectionError, OSError):
            return error(503, "the training worker did not take the payload")
        if not applied.ok:
            return error(REFUSAL_STATUS.get(applied.reason, 400), f"{applied.reason}: {applied.detail}")
        self.pushes_accepted += 1
        return web.json_response({"accepted": True, "version": applied.version, "weight": applied.weight})

    async def get_status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.status(), dumps=lambda o: json.dumps(o, default=str))

    async def get_metrics(self, request: web.Request) -> web.StreamResponse:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_health(self, request: web.Request) -> web.StreamResponse:
        if self.healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="worker not running\n")
