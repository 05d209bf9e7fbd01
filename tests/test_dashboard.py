"""The dashboard's server side: the history ring, the cluster view against real sockets, and
who may read the page when a cluster secret is set (a real node, plain HTTP requests)."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from daemon_util import http_request, serve_get
from nodes import STUB, NodeProc, wait_for

from p2pnode.config import Config, mode_rule
from p2pnode.dashboard.cluster import (
    ClusterLimits,
    ClusterView,
    advice,
    edge_counters,
    label_skew,
    node_row,
)
from p2pnode.dashboard.history import History
from p2pnode.dashboard.routes import ASSETS, load_assets
from p2pnode.membership.base import Member, MemberState
from p2pnode.net.client import PeerClient

ROOT = Path(__file__).resolve().parents[1]


def status_doc(node_id: str, samples: int, received: int = 0, sent: int = 0, served: int = 0,
               peers: dict[str, Any] | None = None, loss: float = 0.5, classes: Any = None) -> dict[str, Any]:
    """The parts of a ``/v1/status`` document the dashboard reads."""
    return {"node_id": node_id, "addr": "", "incarnation": 1, "uptime_s": 1.0,
            "training": {"step": samples // 64, "samples": samples, "loss": loss, "accuracy": 0.5, "test_loss": 1.0,
                         "done": False, "worker_alive": True, "classes": classes if classes is not None else []},
            "exchanges": {"done": 3, "skipped": 1}, "peers": peers or {}, "members": [],
            "bytes": {"client_received": received, "client_sent": sent, "model_served": served}}


# --- history ------------------------------------------------------------------------------------

def test_history_rates_come_from_consecutive_samples() -> None:
    h = History(lambda: {}, capacity=10)
    first = h.sample(status_doc("a", 0), now=100.0, wall=1.0)
    assert first.samples_per_s is None and first.bytes_in_per_s is None  # nothing to compare with yet
    p = h.sample(status_doc("a", 640, received=5000, sent=100, served=1900), now=102.0, wall=3.0)
    assert (p.samples_per_s, p.bytes_in_per_s, p.bytes_out_per_s) == (320.0, 2500.0, 1000.0)
    # Over the last RATE_SPAN samples, not only the last second.
    assert h.sample(status_doc("a", 1280, received=5000), now=103.0).samples_per_s == round(1280 / 3, 2)
    # A worker restarted from a checkpoint counts from an earlier figure: no rate (never negative).
    assert h.sample(status_doc("a", 128), now=104.0).samples_per_s is None
    assert h.sample(status_doc("a", 192), now=105.0).samples_per_s == 64.0


def test_history_is_bounded_json_safe_and_incremental() -> None:
    h = History(lambda: {}, capacity=5)
    for i in range(12):
        h.sample(status_doc("a", 64 * i, loss=float("nan") if i == 11 else 0.5), now=float(i))
    assert [p["seq"] for p in h.since(0)] == [8, 9, 10, 11, 12]
    assert [p["seq"] for p in h.since(10)] == [11, 12]
    doc = h.to_json(11)
    assert doc["last_seq"] == 12 and doc["capacity"] == 5 and len(doc["points"]) == 1
    assert doc["points"][0]["loss"] is None  # NaN is not JSON
    json.dumps(doc, allow_nan=False)
    with pytest.raises(ValueError):
        History(lambda: {}, interval=0)


async def test_history_actor_samples_until_cancelled() -> None:
    calls = 0

    def status() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("status not ready")  # skipped, the actor goes on
        return status_doc("a", 64 * calls)

    h = History(status, interval=0.01)
    task = asyncio.create_task(h.run())
    while len(h.points) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [p.samples for p in list(h.points)[:2]] == [64, 192]


# --- cluster view against real HTTP servers -------------------------------------------------------


async def test_cluster_view_lists_members_bounded_and_never_waits_past_the_timeout() -> None:
    peer_state = {"samples": 640, "bytes": 1000}

    async def good(request: web.Request) -> web.Response:
        peers = {"a": {"bytes_received": peer_state["bytes"]}}
        # NaN, as Python's json writes it for a loss not known yet: not JSON, must not pass through
        return web.json_response(status_doc("b", peer_state["samples"], peers=peers, loss=float("nan"),
                                            classes=[0, 0, 30, 70]))

    async def hangs(request: web.Request) -> web.Response:
        await asyncio.sleep(3)  # far past the view's 1 s timeout; the server waits it out at cleanup
        return web.json_response({})

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="<html>not a status</html>")

    servers = [await serve_get("/v1/status", h) for h in (good, hangs, garbage)]
    (_, b_addr), (_, slow_addr), (_, bad_addr) = servers
    members = [Member("a", "127.0.0.1:1", MemberState.ALIVE), Member("b", b_addr, MemberState.ALIVE),
               Member("c", slow_addr, MemberState.SUSPECT), Member("d", bad_addr, MemberState.ALIVE),
               Member("e", "127.0.0.1:9", MemberState.DEAD)]
    members += [Member(f"z{i:02d}", "127.0.0.1:9", MemberState.LEFT) for i in range(10)]
    own = {"samples": 64}
    client = PeerClient()
    mode = mode_rule.status(mode_rule.choose(Config()), "SGD", False, [50, 50, 0, 0])
    view = ClusterView("a", lambda: status_doc("a", own["samples"], peers={"b": {"bytes_received": 500}},
                                               classes=[50, 50, 0, 0]) | {"mode": mode},
                       lambda: members, client, ClusterLimits(max_nodes=8, timeout=1.0, cache_s=0.0))
    try:
        first = await view.build()
        rows = {r["node_id"]: r for r in first["nodes"]}
        assert list(rows)[:5] == ["a", "b", "d", "c", "e"]  # this node, then alive, suspect, dead, left
        assert len(first["nodes"]) == 8 and first["omitted"] == 7
        assert rows["a"]["self"] and rows["b"]["reachable"] and rows["b"]["step"] == 10
        assert first["mode"] == mode and mode["name"] == "gossip"  # this node's, for the page's header
        assert rows["b"]["loss"] is None and rows["a"]["loss"] == 0.5
        json.dumps(first, allow_nan=False)
        # a and b share no class: each is 1.0 from the other (the nodes that gave no histogram
        # are left out), and the view says what to do about it
        assert rows["a"]["label_skew"] == rows["b"]["label_skew"] == 1.0 and rows["c"]["label_skew"] is None
        assert first["advice"] and "exchange.sync" in first["advice"] and "1.00 apart" in first["advice"]
        assert "no answer within 1 s" in rows["c"]["error"] and not rows["c"]["reachable"]
        assert rows["d"]["error"] == "status is not JSON"
        assert rows["e"]["state"] == "dead" and rows["e"]["error"] is None  # not asked: known dead
        recent = {(e["src"], e["dst"]): e["bytes_recent"] for e in first["edges"]}
        assert recent == {("a", "b"): None, ("b", "a"): None}  # one view: nothing to compare with yet
        peer_state.update(samples=1280, bytes=3000)
        own["samples"] = 128
        second = await view.build()
        edges = {(e["src"], e["dst"]): (e["bytes_total"], e["bytes_recent"]) for e in second["edges"]}
        assert edges == {("a", "b"): (3000, 2000), ("b", "a"): (500, 0)}  # (served by, fetched by)
        assert second["window_s"] >= 0 and {r["node_id"]: r["samples_per_s"] for r in second["nodes"][:2]}["b"] > 0
    finally:
        await client.close()
        for runner, _ in servers:
            await runner.cleanup()


def test_label_skew_reads_only_well_formed_histograms_and_advice_is_for_gossip_on_unlike_data() -> None:
    docs = {"a": status_doc("a", 0, classes=[10, 10, 0]), "b": status_doc("b", 0, classes=[5, 5, 0]),
            "c": status_doc("c", 0, classes=[1, 1, 1]), "bad": status_doc("bad", 0, classes=[1, "x", 2]),
            "neg": status_doc("neg", 0, classes=[1, -1, 2]), "short": status_doc("short", 0, classes=[1, 1]),
            "junk": {"training": "junk"}, "none": {}}
    skew = label_skew(docs)
    assert set(skew) == {"a", "b", "c"}  # "short" is read, but no other histogram is of its length
    assert skew["c"] == 0.333  # against a + b pooled, [1/2, 1/2, 0]: (1/6 + 1/6 + 1/3) / 2
    gossip = status_doc("a", 0)
    assert advice(gossip, {"a": 0.05, "b": 0.19}) is None  # alike (even shards: 0.01)
    assert advice(gossip, {"a": 0.05, "b": 0.8}) is not None
    assert advice({**gossip, "sync": {"mode": "powersgd"}}, {"a": 0.8}) is None  # already the remedy
    assert advice({**gossip, "ps": {}}, {"a": 0.8}) is None and advice(gossip, {}) is None
    # a member's status is its own to write: tables that are not objects read as empty
    row = node_row(None, {"training": "junk", "exchanges": [1], "bytes": 3})
    assert row["reachable"] and row["step"] is None and row["bytes_out"] == 0


def test_the_terminal_view_shows_each_nodes_skew_and_the_advice() -> None:
    from rich.console import Console

    from p2pnode.watch import WIDE, Target, render

    view = {"nodes": [{"node_id": "a" * 16, "state": "alive", "reachable": True, "label_skew": 0.823, "self": True},
                      {"node_id": "b" * 16, "state": "alive", "reachable": True, "label_skew": None}],
            "edges": [], "advice": advice(status_doc("a", 0), {"a": 0.823})}
    console = Console(width=WIDE, record=True)
    console.print(render(Target("127.0.0.1:1"), view, None, WIDE))
    shown = console.export_text()
    assert "skew" in shown and "0.82" in shown and "advice: the nodes' label distributions differ" in shown, shown


def test_the_terminal_view_shows_this_nodes_mode_and_the_advice_a_gossip_node_with_adamw_gets() -> None:
    """exchange.sync = "auto" without a secret picks gossip; a task with AdamW is then told that a
    cluster secret would pick the synchronous mode (config/mode_rule.py), here and in status."""
    from rich.console import Console

    from p2pnode.watch import WIDE, Target, render

    mode = mode_rule.status(mode_rule.choose(Config()), "AdamW", True, [])
    assert mode["label_skew"] is None and mode["advice"] and "cluster secret" in mode["advice"]
    view = {"nodes": [{"node_id": "a" * 16, "state": "alive", "reachable": True, "self": True}], "edges": [],
            "advice": None, "mode": mode}
    console = Console(width=WIDE, record=True)
    console.print(render(Target("127.0.0.1:1"), view, None, WIDE))
    shown = " ".join(console.export_text().split())
    assert "mode: gossip (exchange.sync = auto: no cluster secret" in shown, shown
    assert "advice: the optimizer AdamW adapts each coordinate's step" in shown, shown
    # skewed labels call for the same advice; an even shard with SGD, or a secret, for none
    assert "labels are 0.75 from an even mix" in mode_rule.status(mode_rule.choose(Config()), "SGD", False,
                                                                  [10, 0, 0, 0])["advice"]
    assert mode_rule.status(mode_rule.choose(Config()), "SGD", False, [5, 5, 5, 5])["advice"] is None
    trusted = Config()
    trusted.node.secret = "s"
    assert mode_rule.status(mode_rule.choose(trusted), "AdamW", True, [10, 0, 0, 0])["advice"] is None


def test_edge_counters_ignore_malformed_peer_records() -> None:
    docs = {"a": {"peers": {"b": {"bytes_received": 10}, "c": {"bytes_received": "x"}, "a": {"bytes_received": 5},
                            "d": "junk", "e": {"bytes_received": 0}}},
            "b": {"peers": ["not", "a", "map"]}}
    assert edge_counters(docs) == {("b", "a"): 10}


# --- packaging --------------------------------------------------------------------------------

def test_the_page_ships_as_package_data_and_loads_nothing_from_elsewhere() -> None:
    assets = load_assets()
    assert set(assets) == set(ASSETS)
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "static/*" in cfg["tool"]["setuptools"]["package-data"]["p2pnode.dashboard"]
    for name, body in assets.items():
        text = body.decode()
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
            '"http://www.w3.org/2000/svg"', ""), name
        assert "https://" not in text and "//cdn" not in text, name


# --- access with a cluster secret (a real node) ------------------------------------------------------

SECRET, TOKEN = b"cluster-secret-1", "read-only-token-2"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_with_a_secret_the_page_needs_the_token_or_the_secret(cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    (tmp_path / "token").write_text(TOKEN + "\n")
    node: NodeProc = cluster("a", extra=[*STUB, "--set", f"node.secret_file={tmp_path / 'secret'}",
                                         "--set", f"node.dashboard_token_file={tmp_path / 'token'}"])
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    def ready() -> bool:
        code, _, body = http_request(node.addr, "GET", "/v1/status", headers=bearer, timeout=2)
        return code == 200 and json.loads(body)["joined"]

    wait_for(ready, 40, "the node to serve its status to the token")

    code, headers, _ = http_request(node.addr, "GET", "/")
    assert code == 401 and headers["www-authenticate"].startswith("Basic ")
    assert http_request(node.addr, "GET", "/?token=wrong")[0] == 401
    code, headers, _ = http_request(node.addr, "GET", "/?token=" + TOKEN)
    assert code == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    assert TOKEN not in cookie  # the cookie carries an HMAC of the token, not the token
    code, headers, body = http_request(node.addr, "GET", "/", headers={"Cookie": cookie})
    assert code == 200 and b"dashboard.js" in body and "default-src 'none'" in headers["content-security-policy"]
    assert http_request(node.addr, "GET", "/static/dashboard.js", headers={"Cookie": cookie})[0] == 200
    basic = "Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    for creds in (bearer, {"Authorization": basic}, {"Authorization": "Bearer " + SECRET.decode()}):
        code, _, body = http_request(node.addr, "GET", "/v1/cluster", headers=creds)
        assert code == 200 and json.loads(body)["nodes"][0]["self"], creds
    assert http_request(node.addr, "GET", "/v1/history?since=0", headers=bearer)[0] == 200
    assert http_request(node.addr, "GET", "/v1/history?since=x", headers=bearer)[0] == 400
    assert http_request(node.addr, "GET", "/static/nope.js", headers=bearer)[0] == 404
    # Read-only: the token opens nothing a peer uses; those still need the HMAC signature.
    assert http_request(node.addr, "GET", "/v1/model", headers=bearer)[0] == 401
    assert http_request(node.addr, "POST", "/v1/model?from=x", b"\x00", headers=bearer)[0] == 401
    assert http_request(node.addr, "GET", "/v1/cluster", secret=SECRET)[0] == 200  # peers and the CLI sign
    assert http_request(node.addr, "GET", "/metrics")[0] == 200  # open, as before
    # The CLI with the token file: one-shot status.
    cli = [sys.executable, "-m", "p2pnode", "status", node.addr]
    out = subprocess.run([*cli, "--token-file", str(tmp_path / "token")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"at {node.addr}" in out.stdout, out.stderr
    out = subprocess.run(cli, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "401" in out.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_a_secret_the_page_is_open(cluster: Any) -> None:
    node = cluster("a", extra=STUB)
    node.wait_ready()
    with urllib.request.urlopen(f"http://{node.addr}/", timeout=5) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")

    def two_points() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://{node.addr}/v1/history", timeout=5) as resp:
            pts = json.load(resp)["points"]
        return pts if len(pts) >= 2 and pts[-1]["samples_per_s"] is not None else []

    pts = wait_for(two_points, 20, "two history points")
    assert pts[-1]["seq"] > pts[0]["seq"] and math.isfinite(pts[-1]["t"])
