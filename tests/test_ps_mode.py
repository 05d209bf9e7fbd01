"""Parameter-server mode (``node.role = "ps"`` / ``"ps-worker"``, p2pnode/ps/): real daemons on
loopback with the torch worker on a small synthetic task. The server applies every worker's
pushed gradient (its model version and step advance with each, each worker's pushes are counted),
refuses garbage, a stranger's gradient (403: only members push, as to ``/v1/model``) and a peer's
model push without changing anything, and goes on applying the survivor's pushes after another
worker is SIGKILLed: a dead worker never stalls it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from daemon_util import http_request
from nodes import wait_for

PS = ["--set", "node.role=ps", "--set", "compression.publish=topk:density=1.0", "--set", "exchange.timeout=5"]
WORKER = ["--set", "node.role=ps-worker", "--set", "exchange.timeout=5"]


@pytest.mark.beside_clusters
def test_ps_daemon_modules_import_no_torch() -> None:
    probe = ("import sys, p2pnode.ps.mode, p2pnode.ps.messages, p2pnode.daemon.node\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.beside_clusters
def test_ps_worker_needs_a_server() -> None:
    out = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--set", "node.role=ps-worker"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "node.role" in out.stderr and "seed" in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_server_applies_pushes_and_survives_a_killed_worker(cluster) -> None:
    server = cluster("ps", extra=PS)
    server.wait_ready(90)
    first = server.status()["training"]["published_version"]
    workers = [cluster(f"w{i}", seeds=[server.addr], extra=[*WORKER, "--shard", f"{i}/2"]) for i in range(2)]
    ids = [w.wait_ready(90)["node_id"] for w in workers]

    def pushes() -> dict[str, int]:
        return {k: v["pushes"] for k, v in server.status()["ps"]["workers"].items()}

    wait_for(lambda: all(pushes().get(i, 0) >= 5 for i in ids), 120, "both workers' pushes applied")
    s = server.status()
    assert s["ps"]["applied"] >= 10 and s["training"]["step"] >= s["ps"]["applied"]
    assert s["training"]["published_version"] > first  # every applied push is published
    w = workers[0].status()
    assert w["ps"]["pulls"] >= 5 and w["ps"]["version"] > 0  # the worker pulls the server's weights

    # garbage and a peer's model push change nothing: refused, counted, no version for them
    refused = s["ps"]["refused"]
    status, _, _ = http_request(server.addr, "POST", f"/v1/ps/gradient?from={ids[0]}",
                                b"\x81\xa3fmt\x01" + b"\0" * 64)
    assert status == 400  # a member's (a worker's) garbage: past the member check, refused as a payload
    # a stranger's gradient is refused from the headers (as a model push is: daemon/push.py),
    # counted as not-member; it never reaches the server's worker (no pusher entry for it)
    status, _, reply = http_request(server.addr, "POST", "/v1/ps/gradient?from=stranger",
                                    b"\x81\xa3fmt\x01" + b"\0" * 64)
    assert status == 403 and "members only" in reply.decode(), reply
    after = server.status()
    assert after["pushes"]["refused"] >= 1 and after["pushes"]["last_refused"]["from"] == "stranger"
    assert "stranger" not in after["ps"]["workers"]
    status, _, _ = http_request(server.addr, "POST", f"/v1/model?from={ids[0]}", b"\x81\xa3fmt\x01" + b"\0" * 64)
    assert status == 400  # a member's (the worker's, on loopback as this test is) garbage
    status, _, _ = http_request(server.addr, "POST", "/v1/model?from=x", b"\x81\xa3fmt\x01" + b"\0" * 64)
    assert status == 403  # a stranger's: refused from the headers
    assert server.status()["ps"]["refused"] >= refused  # the prefix guard may refuse it before the worker

    workers[1].signal(signal.SIGKILL)
    assert workers[1].proc is not None
    workers[1].proc.wait(10)
    before = pushes()
    # the survivor's pushes go on being applied (the dead worker's last push may still be in
    # the server's queue: the server's count alone would not say whose)
    wait_for(lambda: pushes()[ids[0]] >= before[ids[0]] + 15, 90, "the survivor's pushes applied after the kill")
    after = pushes()
    assert after.get(ids[1], 0) <= before.get(ids[1], 0) + 1  # at most one in flight at the kill
    assert server.status()["training"]["worker_alive"]
