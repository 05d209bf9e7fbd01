"""The cluster view: every member's figures side by side, and who exchanged with whom.

Built by this node on request (``GET /v1/cluster``, for the dashboard and ``p2pnode status
--watch``) from its members' ``/v1/status``, fetched concurrently through the node's own
``PeerClient`` (signed when a secret is set, TLS when on). Bounded on every side: at most
``max_nodes`` members are listed, at most ``concurrency`` requests are in flight, each has a
``timeout``, and a view younger than ``cache_s`` is served again, so ten open browsers cost the
cluster what one does. A member that does not answer is listed with its error, never waited for.

"Recently" for the exchange graph: the view keeps the per-edge byte counters of the views it
built over the last ``window_s`` seconds; an edge's ``bytes_recent`` is what crossed it since
the oldest of those (``None`` until there are two views to compare).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from p2pnode.membership.base import Member
from p2pnode.net.client import PeerClient, PeerError
from p2pnode.partition import UNLIKE, distance

log = logging.getLogger("p2pnode.cluster")

#: bodies larger than this are not a status document
MAX_STATUS_BYTES = 4 * 1024 * 1024
#: ``advise``: seconds after this node first sees a peer before it compares the members' data
#: (the others of a cluster started together have joined by then); then tries this many times,
#: this many seconds apart, while fewer than two members' label histograms are known
ADVISE_AFTER = 5.0
ADVISE_TRIES = 5
ADVISE_EVERY = 30.0
STATE_ORDER = {"alive": 0, "suspect": 1, "dead": 2, "left": 3}


@dataclass
class ClusterLimits:
    max_nodes: int = 32
    timeout: float = 1.0
    concurrency: int = 8
    cache_s: float = 1.0
    window_s: float = 30.0


@dataclass
class _Snapshot:
    at: float  # monotonic
    edges: dict[tuple[str, str], int]  # (served by, fetched by) -> bytes received by the fetcher
    samples: dict[str, int]


def _num(value: Any) -> int | float | None:
    """A finite number from a status document, as it came (ints stay ints); anything else,
    NaN and infinities included (not JSON), is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _table(status: dict[str, Any], key: str) -> dict[str, Any]:
    """``status[key]`` where it is a JSON object, else empty: a member's status is its own to
    write, and a malformed one must not break the view of the others."""
    value = status.get(key)
    return value if isinstance(value, dict) else {}


def member_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """This node's member table with its fetches from each: the dashboard's members panel."""
    peers = status.get("peers") or {}
    rows = []
    for m in status.get("members") or []:
        p = peers.get(m.get("node_id")) or {}
        rows.append({"node_id": m.get("node_id"), "addr": m.get("addr"), "state": m.get("state"),
                     "incarnation": m.get("incarnation"), "ok": _num(p.get("ok")), "failed": _num(p.get("failed")),
                     "last_error": p.get("last_error") or None})
    return rows


def node_row(member: Member | None, status: dict[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    """One line of the cluster table, from a member entry and (if it answered) its status."""
    row: dict[str, Any] = {
        "node_id": member.node_id if member else None, "addr": member.addr if member else None,
        "state": str(member.state) if member else None, "incarnation": member.incarnation if member else None,
        "reachable": status is not None, "error": error, "step": None, "samples": None, "samples_per_s": None,
        "loss": None, "accuracy": None, "exchanges_done": None, "exchanges_skipped": None, "bytes_in": None,
        "bytes_out": None, "done": None, "worker_alive": None, "uptime_s": None, "members_alive": None,
    }
    if status is None:
        return row
    t, ex, b = _table(status, "training"), _table(status, "exchanges"), _table(status, "bytes")
    row.update({
        "node_id": row["node_id"] or status.get("node_id"), "addr": row["addr"] or status.get("addr"),
        "step": _num(t.get("step")), "samples": _num(t.get("samples")), "loss": _num(t.get("loss")),
        "accuracy": _num(t.get("accuracy")), "exchanges_done": _num(ex.get("done")),
        "exchanges_skipped": _num(ex.get("skipped")),
        # what the HTTP client moved, and what our server answered and took in for the model (a
        # mode's own routes: the synchronous mode's reducer, a parameter server's pushes)
        "bytes_in": (_num(b.get("client_received")) or 0) + (_num(b.get("routes_received")) or 0),
        "bytes_out": ((_num(b.get("client_sent")) or 0) + (_num(b.get("model_served")) or 0)
                      + (_num(b.get("routes_answered")) or 0)),
        "done": bool(t.get("done")), "worker_alive": bool(t.get("worker_alive")),
        "uptime_s": _num(status.get("uptime_s")),
        "members_alive": sum(1 for m in status.get("members") or []
                             if isinstance(m, dict) and m.get("state") == "alive"),
    })
    if row["incarnation"] is None:
        row["incarnation"] = _num(status.get("incarnation"))
    return row


def label_skew(statuses: dict[str, dict[str, Any]]) -> dict[str, float]:
    """How far each node's label distribution is from the other answering nodes' pooled one
    (``partition.distance``; a node whose status gives no class histogram is left out)."""
    hists: dict[str, list[int]] = {}
    for node_id, status in statuses.items():
        classes = _table(status, "training").get("classes")
        if (isinstance(classes, list) and 0 < len(classes) <= 4096
                and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in classes)):
            hists[node_id] = classes
    out = {}
    for node_id, mine in hists.items():
        d = distance(mine, [h for n, h in hists.items() if n != node_id])
        if d is not None:
            out[node_id] = round(d, 3)
    return out


def advice(own: dict[str, Any], skew: dict[str, float]) -> str | None:
    """A line for the operator where the nodes' data is unlike and gossip trains on it: the
    measured remedy (docs/BENCHMARKS.md: gossip 3-8 pt under DDP on such shards, the
    synchronous mode within 0.5 pt)."""
    worst = max(skew.values(), default=0.0)
    if worst <= UNLIKE or "sync" in own or "ps" in own:  # not gossip: the all-reduce, or a parameter server
        return None
    mode = _table(own, "mode")
    if mode.get("setting") == "auto":  # gossip for want of a secret (config/mode_rule.py)
        how = ("; give every node a cluster secret (node.secret_file) and exchange.sync = \"auto\" picks it "
               "(docs/ALGORITHMS.md, \"Gossip or the synchronous mode\")")
    else:
        how = " (docs/ALGORITHMS.md, \"Synchronous PowerSGD\"), among machines you trust"
    return (f"the nodes' label distributions differ (up to {worst:.2f} apart, total variation): gossip ends "
            "3-8 points under all-reduce on such data; the synchronous mode (exchange.sync = \"powersgd\") "
            f"learns it within 0.5{how}")


def edge_counters(statuses: dict[str, dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(served by, fetched by) -> model bytes, from each node's own per-peer records."""
    out: dict[tuple[str, str], int] = {}
    for node_id, status in statuses.items():
        peers = status.get("peers")
        if not isinstance(peers, dict):
            continue
        for peer_id, rec in peers.items():
            got = rec.get("bytes_received") if isinstance(rec, dict) else None
            if isinstance(got, int) and got > 0 and peer_id != node_id:
                out[(str(peer_id), node_id)] = got
    return out


class ClusterView:
    def __init__(self, node_id: str, status: Callable[[], dict[str, Any]], members: Callable[[], list[Member]],
                 client: PeerClient, limits: ClusterLimits | None = None) -> None:
        self.node_id = node_id
        self.status = status
        self.members = members
        self.client = client
        self.limits = limits or ClusterLimits()
        self._sem = asyncio.Semaphore(self.limits.concurrency)
        self._lock = asyncio.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._history: deque[_Snapshot] = deque()

    async def get(self) -> dict[str, Any]:
        """The view, built at most once per ``cache_s`` whoever asks."""
        async with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.limits.cache_s:
                return self._cached[1]
            view = await self.build()
            self._cached = (time.monotonic(), view)
            return view

    async def _fetch(self, member: Member) -> tuple[dict[str, Any] | None, str | None]:
        async with self._sem:
            try:
                resp = await self.client.request("GET", member.addr, "/v1/status", timeout=self.limits.timeout)
            except PeerError as exc:
                return None, str(exc)
        if resp.status != 200:
            return None, f"HTTP {resp.status}"
        if len(resp.body) > MAX_STATUS_BYTES:
            return None, "status document too large"
        try:
            doc = json.loads(resp.body)
        except ValueError:
            return None, "status is not JSON"
        return (doc, None) if isinstance(doc, dict) else (None, "status is not a JSON object")

    def _chosen(self) -> tuple[list[Member], int]:
        """Members to list, this node first then by state and id; and how many were left out."""
        others = sorted((m for m in self.members() if m.node_id != self.node_id),
                        key=lambda m: (STATE_ORDER.get(str(m.state), 9), m.node_id))
        keep = max(0, self.limits.max_nodes - 1)
        return others[:keep], max(0, len(others) - keep)

    async def build(self) -> dict[str, Any]:
        own = self.status()
        me = next((m for m in self.members() if m.node_id == self.node_id), None)
        chosen, omitted = self._chosen()
        fetch = [m for m in chosen if str(m.state) in ("alive", "suspect")]
        results = await asyncio.gather(*(self._fetch(m) for m in fetch))
        answers = {m.node_id: r for m, r in zip(fetch, results, strict=True)}
        statuses: dict[str, dict[str, Any]] = {self.node_id: own}
        rows = [node_row(me, own) | {"node_id": self.node_id, "addr": own.get("addr"), "self": True}]
        for m in chosen:
            doc, err = answers.get(m.node_id, (None, None))
            if doc is not None:
                statuses[m.node_id] = doc
            rows.append(node_row(m, doc, err) | {"self": False})
        now = time.monotonic()
        snap = _Snapshot(now, edge_counters(statuses),
                         {r["node_id"]: int(r["samples"]) for r in rows if r["samples"] is not None})
        while self._history and now - self._history[0].at > self.limits.window_s:
            self._history.popleft()
        base = self._history[0] if self._history else None
        self._history.append(snap)
        if base is not None:
            span = now - base.at
            for r in rows:
                old = base.samples.get(r["node_id"])
                if old is not None and r["samples"] is not None and span > 0:
                    r["samples_per_s"] = round(max(0.0, (r["samples"] - old) / span), 1)
        skew = label_skew(statuses)
        for r in rows:
            r["label_skew"] = skew.get(r["node_id"])
        edges = []
        for (src, dst), total in sorted(snap.edges.items()):
            recent = None
            if base is not None:
                before = base.edges.get((src, dst), 0)
                recent = total - before if total >= before else total  # counters restart with a node
            edges.append({"src": src, "dst": dst, "bytes_total": total, "bytes_recent": recent})
        return {"self": self.node_id, "generated_at": round(time.time(), 3), "nodes": rows, "edges": edges,
                "members": member_rows(own), "advice": advice(own, skew),
                # this node's mode and why (exchange.sync = "auto": config/mode_rule.py), with its advice
                "mode": _table(own, "mode") or None,
                "window_s": round(now - base.at, 1) if base is not None else 0.0, "omitted": omitted,
                "limits": {"max_nodes": self.limits.max_nodes, "timeout_s": self.limits.timeout}}


async def advise(view: ClusterView, has_peers: Callable[[], bool]) -> None:
    """Say the view's ``advice`` once in the log, where an operator who never opens the
    dashboard reads it (journalctl): the members' data is unlike, and gossip trains on it."""
    while not has_peers():
        await asyncio.sleep(1.0)
    await asyncio.sleep(ADVISE_AFTER)
    if not _table(view.status(), "training").get("classes"):
        return  # our task lists no labels (or our worker is not up): nothing to compare
    for _ in range(ADVISE_TRIES):
        try:
            built = await view.get()
        except (ValueError, KeyError, TypeError) as exc:  # a view that cannot be built is no advice
            log.debug("no cluster view for the advice: %s", exc)
            return
        if built["advice"]:
            log.warning("%s", built["advice"])
            return
        if sum(1 for r in built["nodes"] if r.get("label_skew") is not None) >= 2:
            return  # compared, and alike
        await asyncio.sleep(ADVISE_EVERY)
