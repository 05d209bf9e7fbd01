"""The parameter server's endpoint (``node.role = "ps"``): ``POST /v1/ps/gradient?from=ID``.

Daemon side, torch-free. Only members may push, as for ``POST /v1/model``: the guard's precheck
(``daemon/push.py``, ``exchange.accept_pushes``) answers 403 from the headers unless ``from``
is a running member of the server's membership pushing from its own host (its ps-workers join
it: the server is their first seed). The body is a gradient payload (``ps/worker_gradient.py``); the guard reads it
under the same limit as a model push (``HttpApi.body_limit``) and refuses one that cannot begin
a payload of this model from its first bytes. It goes to the server's worker process, which
applies it at once and answers with the new model version: 200 ``{"accepted": true, "version":
V, "staleness": S}``, or 400 / 422 for a payload it refuses (nothing changed), 503 when the
worker does not take it within ``exchange.timeout``. Each push is answered on its own: no push
waits for another worker, so a dead worker stalls nothing. Weights are served by the ordinary
``GET /v1/model`` (snapshot, or a delta since the version a worker holds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from p2pnode.config import Config
from p2pnode.daemon.http import REFUSAL_STATUS, HttpApi
from p2pnode.daemon.pipe import WorkerPipe
from p2pnode.net.server import error
from p2pnode.pipe_protocol import Applied
from p2pnode.ps.messages import PsPush

#: where ps-workers push their gradients (from members only: the push check, daemon/push.py)
PATH = "/v1/ps/gradient"
#: workers shown in status (the most recent pushers); beyond it the oldest is forgotten
MAX_WORKERS_SHOWN = 256


@dataclass
class PusherStats:
    """One worker as the server saw it."""

    pushes: int = 0
    refused: int = 0
    bytes: int = 0
    staleness_sum: float = 0.0
    last_push: float = field(default_factory=time.monotonic)

    def to_json(self) -> dict[str, Any]:
        return {"pushes": self.pushes, "refused": self.refused, "bytes": self.bytes,
                "mean_staleness": round(self.staleness_sum / self.pushes, 3) if self.pushes else None,
                "seconds_since_push": round(time.monotonic() - self.last_push, 3)}


class PsServer:
    def __init__(self, cfg: Config, api: HttpApi, pipe: WorkerPipe) -> None:
        self.cfg = cfg
        self.api = api
        self.pipe = pipe
        self.workers: dict[str, PusherStats] = {}
        self.applied = 0
        self.refused = 0
        self.bytes_received = 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(PATH, self.post_gradient)

    def _stats(self, peer: str) -> PusherStats:
        stats = self.workers.pop(peer, None) or PusherStats()
        self.workers[peer] = stats  # most recent last
        while len(self.workers) > MAX_WORKERS_SHOWN:
            self.workers.pop(next(iter(self.workers)))
        return stats

    async def post_gradient(self, request: web.Request) -> web.StreamResponse:
        rejected = self.api.metrics.rejected
        limit = self.api.post_limit()
        if request.content_length is not None and request.content_length > limit:
            rejected.labels("too-large").inc()
            return error(413, f"body over {limit} bytes")
        peer = request.query.get("from", "")
        if not (0 < len(peer) <= 64 and peer.isprintable()):
            rejected.labels("bad-request").inc()
            return error(400, "?from=NODE_ID is required")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            rejected.labels("too-large").inc()
            return error(413, f"body over {limit} bytes")
        if self.api.model.served is None:
            return error(503, "model not ready")
        try:
            reply = await self.pipe.request(PsPush(token=self.pipe.token(), peer=peer, data=body),  # type: ignore[arg-type]
                                            self.cfg.exchange.timeout)
        except (TimeoutError, ConnectionError, OSError):
            return error(503, "the server's worker did not take the gradient")
        assert isinstance(reply, Applied)
        stats = self._stats(peer)
        stats.last_push = time.monotonic()
        if not reply.ok:
            stats.refused += 1
            self.refused += 1
            rejected.labels(reply.reason if reply.reason in REFUSAL_STATUS else "malformed").inc()
            return error(REFUSAL_STATUS.get(reply.reason, 400), f"{reply.reason}: {reply.detail}")
        stats.pushes += 1
        stats.bytes += len(body)
        stats.staleness_sum += max(0.0, reply.distance)
        self.applied += 1
        self.bytes_received += len(body)
        return web.json_response({"accepted": True, "version": reply.version, "staleness": reply.distance})

    def status(self) -> dict[str, Any]:
        return {"role": "ps", "applied": self.applied, "refused": self.refused, "bytes_received": self.bytes_received,
                "workers": {k: v.to_json() for k, v in self.workers.items()}}
