"""Big models between real daemons on loopback: a 100M-parameter model (400 MB of float32) is
exchanged with no payload limit set by hand; a node serving and decoding a 120 MB payload keeps
answering ``/healthz`` within 100 ms (every probe on a quiet machine; 98 % on a loaded one, none
over 0.5 s: see the test); a peer that
trickles its model's bytes is cut off.

The stub worker with ``training.stub_params`` carries the big model: its steps cost next to
nothing, so what these tests load is the exchange path itself (serving, fetching, decoding,
the pipe, replicas, checkpoints)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_peer import FakePeer
from nodes import FAST, STUB, NodeProc, get_json, wait_for

from benchlib.cluster import NodeProc as BareNode

pytestmark = pytest.mark.slow

Start = Callable[..., NodeProc]
TESTS = Path(__file__).resolve().parent


def big(params: int, *extra: str) -> list[str]:
    # a checkpoint every 10 s (the test settings' 2 s would write 400 MB every 2 s); the
    # exchange.timeout of the test settings (1 s) stays: the deadlines scale from it
    return [*STUB, "--set", f"training.stub_params={params}", "--set", "checkpoint.interval=10",
            "--set", "training.eval_every=0", *extra]


def peer(node: NodeProc, other_id: str) -> dict[str, Any]:
    return get_json(node.addr)["peers"].get(other_id, {"ok": 0, "failed": 0, "rate": 0.0, "last_error": ""})


@pytest.mark.timeout(240)
def test_two_daemons_exchange_a_100m_parameter_model(cluster: Start) -> None:
    params = 100_000_000  # 400 MB of float32: a snapshot over the old fixed 256/512 MiB limits
    a = cluster("a", extra=big(params))
    a_id = a.wait_ready(120)["node_id"]
    b = cluster("b", seeds=[a.addr], extra=big(params))
    b_id = b.wait_ready(120)["node_id"]
    # the fresh node takes its seed's whole model (a 400 MB snapshot), then both average deltas
    wait_for(lambda: get_json(b.addr)["bootstrap"]["state"] in ("adopted", "unchecked"), 120, "b to take a's model")
    wait_for(lambda: peer(a, b_id)["ok"] >= 2 and peer(b, a_id)["ok"] >= 2, 120, "exchanges both ways")
    for node, other in ((a, b_id), (b, a_id)):
        s = get_json(node.addr)
        assert s["config"] and s["peers"][other]["rate"] > 0, s["peers"]  # a measured throughput
        counts = s["membership"]["counts"]
        assert counts["suspect"] == 0 and counts["dead"] == 0, counts  # nobody suspected for being busy
        assert "payload too large" not in node.log() and "over the limit" not in node.log()
    # (the 400 MB snapshot b took went through its daemon's spool, net/spool.py: the folder is
    # made at every start now, so its presence says nothing; tests/test_spool.py shows the path)
    # the periodic checkpoint of a 400 MB model completes (its deadline follows the model)
    wait_for(lambda: (b.state_dir / "checkpoint.stub").exists(), 60, "b's checkpoint")
    assert (b.state_dir / "checkpoint.stub").stat().st_size > 4 * params
    assert "periodic checkpoint did not complete" not in a.log() + b.log()
    # the final checkpoint at stop has time from the model's size (a fixed 5 s left it unwritten)
    assert b.stop(60) == 0
    assert "final checkpoint was not written" not in b.log() and "did not stop cleanly" not in b.log()


#: the nodes of the /healthz test, and its probe, run at this priority: what is measured is the
#: event loop of the node (never held by model-sized work), not the other jobs of a shared machine
PRIORITY = ["nice", "-n", "-10"]


@pytest.mark.timeout(200)
def test_healthz_answers_while_a_big_payload_is_served_and_decoded(tmp_path: Path) -> None:
    params = 30_000_000  # a 120 MB snapshot: a serves it, b decodes it, its worker applies it
    a = BareNode(tmp_path, "a", [*FAST, *big(params)], prefix=PRIORITY)
    b = BareNode(tmp_path, "b", [*FAST, *big(params)], [a.addr], prefix=PRIORITY)
    out = tmp_path / "probe.json"
    probe: subprocess.Popen[bytes] | None = None
    load = os.getloadavg()[0]
    try:
        a.start().wait_ready(120)
        probe = subprocess.Popen([*PRIORITY, sys.executable, str(TESTS / "healthz_probe.py"), a.addr, b.addr,
                                  "90", str(out)])
        b.start().wait_ready(120)
        wait_for(lambda: get_json(b.addr)["bootstrap"]["state"] in ("adopted", "unchecked"), 120,
                 "b to take a's model")
        wait_for(lambda: get_json(b.addr)["exchanges"]["done"] >= 3, 60, "b's exchanges")
        loops = {n.name: get_json(n.addr)["event_loop"] for n in (a, b)}
        load = max(load, os.getloadavg()[0])
        suspects = [get_json(n.addr)["membership"]["counts"]["suspect"] for n in (a, b)]
    finally:
        if probe is not None:
            probe.terminate()
            probe.wait(10)
        for node in (a, b):
            node.stop()
    took = json.loads(Path(str(out) + ".tmp").read_text())
    for addr, times in took.items():
        times = [t for t in times if t < 5.0 or addr == a.addr]  # b's answers before it listened
        assert len(times) > 50, (addr, len(times))
        slow = sorted(t for t in times if t >= 0.1)
        said = (f"{len(slow)} of {len(times)} probes over 100 ms (the slowest {slow[-3:]}), median "
                f"{statistics.median(times):.4f} s; event loops: {loops}")
        print(addr, said, f"load {load:.1f}")  # shown with -s
        # The event loop is never held by model-sized work: serving, decoding, hashing, the
        # body's copies into its buffer (net/bodyfill.py) and the pipe's frames (os.readv) run
        # in threads that let go of the GIL, a streamed answer lets the loop run between its
        # slices, and the worker runs below the daemon's priority. Before, a 120 MB payload held
        # the loop 1.3 s. What still delays an answer is the machine: with other jobs on these 2
        # shared cores (load 6-8), 0-1 of 220-450 probes took over 100 ms (at most 0.2 s), the
        # daemon's main thread waiting in the run queue or the whole machine stalled (both
        # daemons and a sampler at the same raised priority, 0.37 s at once). On the idle machine
        # 0 of 364 and 0 of 258 probes took over 100 ms (median 1.2 ms, the loops' longest lag
        # 7 ms); in a CI run beside the suite's other tests (load average 1.6, under the cores,
        # as the average lags) 1 of 230 took 118 ms. So 2 % may take longer, none 0.5 s: the
        # test tells a loop held by work from a machine that is busy, which no load figure does.
        assert len(slow) <= len(times) // 50 and (not slow or slow[-1] < 0.5), (addr, said, load)
    assert suspects == [0, 0]


@pytest.mark.timeout(120)
def test_a_peer_trickling_its_model_is_cut_off(cluster: Start, fake_peer: Callable[[str], FakePeer]) -> None:
    fake = fake_peer("trickle")  # the evil daemon's model answers, 100 bytes every half second
    timings = ["--set", "exchange.timeout=2.0", "--set", "exchange.every=1"]
    victim = cluster("victim", extra=[*STUB, *timings])
    victim.wait_ready()
    evil = cluster("evil", seeds=[victim.addr], extra=[*STUB, *timings, "--advertise", fake.addr])
    fake.backend = evil.addr
    evil_id = evil.wait_ready()["node_id"]
    started = time.monotonic()
    # each fetch is cut off about 2 s into its body (under exchange.min_rate over a 2 s window),
    # not held for the body's whole trickle (tens of seconds); three in a row: left out
    rec = wait_for(lambda: (r := peer(victim, evil_id))["failed"] >= 3 and r, 60, "the trickling peer to fail")
    # cut off by its rate (under exchange.min_rate over 2 s) or by its deadline (a body this
    # short, from a peer never measured, may take exchange.timeout), whichever comes first
    assert rec["ok"] == 0 and ("too slow" in rec["last_error"] or "not complete within" in rec["last_error"]), rec
    assert time.monotonic() - started < 40
    assert fake.model_gets >= 3


@pytest.mark.beside_clusters  # one stub node: off the training clusters' worker, which is the suite's longest
@pytest.mark.timeout(120)
def test_a_stop_between_periodic_checkpoints_is_clean(cluster: Start) -> None:
    """Stopped while the checkpointer asks for a checkpoint every 0.1 s (each takes a few tenths
    of a second at this size), a node writes its final checkpoint and says nothing failed: a
    periodic checkpoint asked during the stop waited behind it and was never answered ("did not
    complete"), and the node's last cleanup told the exiting worker to stop again ("did not stop
    cleanly"). Three stops, each at another point of the checkpointer's cycle."""
    a = cluster("a", extra=big(40_000_000, "--set", "checkpoint.interval=0.1"))
    for i in range(3):
        if i:
            a.start()
        a.wait_ready(60)
        time.sleep(0.4 + 0.3 * i)
        assert a.stop(60) == 0
        assert "stopped cleanly" in a.log().split("shutting down")[-1]
    log = a.log()
    assert "periodic checkpoint did not complete" not in log and "did not stop cleanly" not in log, log[-3000:]
    assert log.count("(resumed from checkpoint)") == 2  # each restart took the final checkpoint
