"""The synchronous mode (``exchange.sync = "powersgd"``, p2pnode/sync/) on real daemons.

Three nodes with the torch worker on a small synthetic task average every step's gradient
through the reducer: every round has all three (but perhaps the first, on a loaded machine),
and the three models end equal to the bit (the same seeded start, the same mean gradient every step, no gossip, and the
models' mean after the last step). The endpoint
takes contributions only from members, refuses malformed ones with 400, and a phase closes
after ``sync_timeout`` without the nodes it waited for in vain. The all-reduce's bytes are
counted where gossip's are: status's ``bytes.sent`` and ``received``, the demo's report and the
dashboard's bytes in and out."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import msgpack
import numpy as np
import pytest
import torch
from daemon_util import http_request
from nodes import STUB, wait_for

from benchlib.cluster import finished
from p2pnode.dashboard.cluster import node_row
from p2pnode.sync.values import encode
from scripts.demo_report import traffic

SYNC = ["--set", "exchange.sync=powersgd", "--set", "exchange.sync_timeout=0.3"]


def f16(*values: float) -> bytes:
    return np.asarray(values, dtype="<f2").tobytes()


def three_nodes(cluster, run: list[str]) -> tuple[list, list[str]]:
    """Three torch nodes with settings ``run``, each on a third of the data; (nodes, their ids).
    All three start at once (the others join through a when it answers): ``run`` sets
    ``training.min_peers=2``, so none trains before it knows the other two, and their workers
    load torch side by side rather than a's first (3-5 s of each test)."""
    a = cluster("a", extra=[*run, "--shard", "0/3"])
    nodes = [a, *(cluster(f"n{i}", seeds=[a.addr], extra=[*run, "--shard", f"{i}/3"]) for i in (1, 2))]
    ids = [n.wait_ready(90)["node_id"] for n in nodes]
    return nodes, ids


@pytest.mark.beside_clusters  # stub workers
def test_a_node_that_will_not_wait_for_the_others_says_how_to_start_together(cluster) -> None:
    alone = cluster("alone", extra=[*STUB, *SYNC])
    waits = cluster("waits", extra=[*STUB, *SYNC, "--set", "training.min_peers=1", "--set", "training.min_peers_wait=1"])
    for node in (alone, waits):
        node.wait_ready()
    hint = "set training.min_peers to the cluster's size less one"
    wait_for(lambda: hint in alone.log(), 10, "the hint in the log of the node that waits for nobody")
    wait_for(lambda: "training starts with 0 of the 1 peers" in waits.log(), 10, "the other's wait to end")
    assert hint not in waits.log()


@pytest.mark.beside_clusters  # stub workers
def test_the_endpoint_takes_members_only_and_refuses_bad_contributions(cluster) -> None:
    a = cluster("a", extra=[*STUB, *SYNC])
    a.wait_ready()
    status, _, _ = http_request(a.addr, "POST", "/v1/sync?phase=0&round=-1&from=stranger", f16(1, 2))
    assert status == 403  # not a member: refused from the headers, as a model push
    b = cluster("b", extra=[*STUB, *SYNC, "--set", "exchange.accept_pushes=any", "--set", "exchange.sync_values=float16"])
    b.wait_ready()
    for query, body in [("phase=0&from=x", f16(1)), ("phase=3&round=0&from=x", f16(1)),
                        ("phase=0&round=zero&from=x", f16(1)), ("phase=0&round=-1&from=x", b"\x00"),
                        ("phase=0&round=-1&from=x", f16(float("nan"), 1)),
                        # a label histogram (who is waited for when slow): integers, not all 0, at most 256
                        ("phase=0&round=-1&from=x&classes=3,x", f16(1)), ("phase=0&round=-1&from=x&classes=3,-1", f16(1)),
                        ("phase=0&round=-1&from=x&classes=0,0", f16(1)),
                        ("phase=0&round=-1&from=x&classes=" + ",".join(["1"] * 257), f16(1))]:
        status, _, _ = http_request(b.addr, "POST", f"/v1/sync?{query}", body)
        assert status == 400, query
    assert b.status()["sync"]["refused"] == 2  # the two bodies; the queries never reached the reducer
    # a well-formed contribution: b waits for itself (its worker, a stub, sends none) for
    # sync_timeout, then answers with the mean of what came: this one alone
    status, _, _ = http_request(b.addr, "POST", "/v1/sync?phase=1&round=0&from=x&replay=1", b"")
    assert status == 400  # asking for the rounds missed is a phase 0
    status, _, body = http_request(b.addr, "POST", "/v1/sync?phase=0&round=-1&from=x&replay=1", b"")
    assert status == 200 and not msgpack.unpackb(body, raw=False)["replay"]  # no round closed yet: none
    status, _, body = http_request(b.addr, "POST", "/v1/sync?phase=0&round=-1&from=x", f16(1, 2))
    assert status == 200
    out = msgpack.unpackb(body, raw=False)
    assert out["included"] and out["count"] == 1 and out["data"] == f16(1, 2)
    assert out["pace"] == 0.0  # no node's step time known yet (stub workers send none)
    shown = subprocess.run([sys.executable, "-m", "p2pnode", "status", b.addr], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "sync      powersgd rank 24 float16" in shown and "failures 0" in shown, shown
    # int4 values (exchange.sync_values, the default): float16 and int8 bytes are refused, int4
    # ones averaged and answered as int4
    c = cluster("c", extra=[*STUB, *SYNC, "--set", "exchange.accept_pushes=any"])
    c.wait_ready()
    for other in (f16(*range(100)), encode(np.linspace(-3, 3, 100), "int8")):
        status, _, _ = http_request(c.addr, "POST", "/v1/sync?phase=0&round=-1&from=x", other)
        assert status == 400
    sent = encode(np.linspace(-3, 3, 100), "int4")
    status, _, body = http_request(c.addr, "POST", "/v1/sync?phase=0&round=-1&from=x", sent)
    assert status == 200
    assert msgpack.unpackb(body, raw=False)["data"] == sent  # one contribution: its mean is itself


@pytest.mark.beside_clusters  # stub workers
def test_one_contribution_far_from_the_others_is_taken_as_their_median(cluster) -> None:
    """exchange.sync_outlier on a real daemon: four contributions to one phase, one of them the
    others' gradient negated and 100 times over; every contributor gets the mean with that one
    replaced by the phase's median, and status and the log name the node."""
    d = cluster("d", extra=[*STUB, "--set", "exchange.sync=powersgd", "--set", "exchange.sync_timeout=3",
                            "--set", "exchange.accept_pushes=any", "--set", "exchange.sync_values=float16"])
    d.wait_ready()
    rng = np.random.default_rng(0)
    g = rng.normal(size=256)
    parts = {**{n: (g + rng.normal(size=256)).astype("<f2") for n in ("w", "x", "y")}, "z": (-100 * g).astype("<f2")}
    with ThreadPoolExecutor(4) as pool:  # one phase: the reducer waits sync_timeout for its own stub, then closes
        answers = list(pool.map(lambda item: http_request(d.addr, "POST", f"/v1/sync?phase=0&round=-1&from={item[0]}",
                                                          item[1].tobytes(), timeout=30), parts.items()))
    assert {status for status, _, _ in answers} == {200}
    outs = [msgpack.unpackb(body, raw=False) for _, _, body in answers]
    assert {o["count"] for o in outs} == {4} and len({o["data"] for o in outs}) == 1
    stack = np.stack([p.astype(np.float64) for p in parts.values()])
    expected = (stack[:3].sum(axis=0) + np.median(stack, axis=0)) / 4
    mean = np.frombuffer(outs[0]["data"], dtype="<f2").astype(np.float64)
    assert np.allclose(mean, expected, rtol=1e-3, atol=1e-3) and float(mean @ g) > 0
    sync = d.status()["sync"]
    assert sync["outliers"] == 1 and sync["outlier_nodes"] == {"z": 1} and sync["largest_distance"] > 20
    wait_for(lambda: "node z's contribution to round 0 (phase 0)" in d.log(), 10, "the outlier in the log")
    shown = subprocess.run([sys.executable, "-m", "p2pnode", "status", d.addr], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "outliers from z: 1" in shown, shown


@pytest.mark.slow
@pytest.mark.beside_clusters  # stub workers
@pytest.mark.timeout(120)
def test_a_reducer_not_joined_yet_holds_contributions_until_it_knows_their_senders(cluster) -> None:
    """A restarted reducer knows only the members that probed it until it has joined. It used
    to refuse the others from the headers as strangers (403: each took ~30 local steps while
    the rest went on through it). Now a contribution waits for the join (up to sync_timeout),
    then the member check: a member's is taken, a stranger's still refused."""
    a = cluster("a", extra=[*STUB, *SYNC])
    a_id = a.wait_ready()["node_id"]
    a.stop()  # its id stays in its state dir; its address is c's only seed
    c = cluster("c", seeds=[a.addr], extra=[*STUB, "--set", "exchange.sync=powersgd", "--set", "exchange.sync_timeout=6",
                                           "--set", "exchange.sync_values=float16"])
    wait_for(lambda: c.status()["training"]["worker_alive"], 60, "c's worker")
    assert not c.status()["joined"]  # its seed is down: the join is retried with back-off
    with ThreadPoolExecutor(2) as pool:
        member = pool.submit(http_request, c.addr, "POST", f"/v1/sync?phase=0&round=-1&from={a_id}", f16(1, 2), timeout=30)
        stranger = pool.submit(http_request, c.addr, "POST", "/v1/sync?phase=0&round=-1&from=stranger", f16(3, 4),
                               timeout=30)
        time.sleep(0.5)
        assert not member.done() and not stranger.done()  # held, not refused from the headers
        a.start()  # c joins through it at its next try, and knows a then
        status, _, body = member.result(timeout=30)
        assert status == 200, body[:200]
        out = msgpack.unpackb(body, raw=False)
        assert out["included"] and out["data"] == f16(1, 2), out  # taken: the stranger's is not in it
        assert stranger.result(timeout=30)[0] == 403
    assert c.status()["joined"] and c.status()["pushes"]["refused"] == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_nodes_take_the_same_steps(cluster) -> None:
    """Every node waited for (``sync_wait_for_slow = always``): under the default, a node that
    a loaded machine slows for a few steps is rightly left out of rounds and replays them (a
    reducer even stands down: CI saw one take 13 rounds of 20); what is checked here is that
    nodes waited for are in every round, not the machine's load (that policy has its own tests).
    With float16 values (the other tests of real nodes here run the default, int8): every node
    rebuilds the same means from them, so all end on one model to the bit."""
    run = [*SYNC, "--set", "exchange.sync_rank=4", "--set", "exchange.sync_values=float16",
           "--set", "exchange.sync_timeout=5", "--set", "training.min_peers=2",
           "--set", "training.max_samples=1280", "--set", "training.eval_every=0",
           "--set", "exchange.sync_wait_for_slow=always"]
    nodes, _ = three_nodes(cluster, run)
    a = nodes[0]
    wait_for(lambda: all(finished(n.status()) for n in nodes), 150, "every node done, the final mean taken")
    steps = a.status()["training"]["step"]
    for n in nodes:
        s = n.status()
        sync = s["sync"]
        # every step an all-reduce round; on a loaded machine the very first may close before
        # the reducer has heard of every node (it waits for the members it knows)
        assert sync["rounds"] >= steps - 2 and sync["included"] >= steps - 2, sync
        assert sync["missed"] <= 2 and sync["failures"] == 0 and sync["last_count"] == 3, sync
        assert sync["final_count"] == 3  # and after the last step, the models' mean of all three
        assert s["bytes"]["sync_received"] > 0 and s["exchanges"]["done"] == 0  # no gossip beside it
    assert sum(n.status()["sync"]["reduced_here"] for n in nodes) >= steps - 2  # one reducer took them all
    assert sorted(n.status()["sync"]["reduced_here"] for n in nodes)[:2] == [0, 0]
    # each phase 0 said its node's label histogram: the reducer knows how unlike each node's
    # data is the others' (shards of one shuffled set: alike; a slow one would not be waited for)
    reducer = max(nodes, key=lambda n: n.status()["sync"]["reduced_here"]).status()["sync"]
    assert len(reducer["unlike"]) == 3 and all(0 <= d < 0.2 for d in reducer["unlike"].values()), reducer
    assert reducer["wait_for_slow"] == "always" and reducer["resting_until"] == 0  # never stands down
    # the all-reduce's traffic, counted where gossip's is: every byte one node sent (a
    # contribution, a reducer's answer) another took in, and the demo's report and the
    # dashboard show it (the report printed "sent MB 0.0" for such a run when only gossip's counted)
    statuses = [n.status() for n in nodes]
    sent, received = [s["bytes"]["sent"] for s in statuses], [s["bytes"]["received"] for s in statuses]
    assert all(x > 0 for x in sent + received) and sum(sent) == sum(received), (sent, received)
    for s in statuses:
        b = s["bytes"]
        assert traffic(b) == (b["sent"], b["received"]) and b["sync_sent"] + b["model_served"] == b["sent"]
        row = node_row(None, s)  # the dashboard's table (and its chart, from the same counters)
        assert row["bytes_in"] >= b["received"] and row["bytes_out"] >= b["sent"], (row, b)
    for n in nodes:
        n.stop()
    models = [torch.load(n.state_dir / "checkpoint.pt", weights_only=True)["model"] for n in nodes]
    for other in models[1:]:
        assert all(torch.equal(models[0][k], other[k]) for k in models[0])


@pytest.mark.beside_clusters  # the command exits at once
@pytest.mark.parametrize("extra", [["--set", "node.role=ps"], ["--set", "training.outer=nesterov"]])
def test_sync_is_refused_where_it_cannot_run(extra: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "p2pnode", "start", *SYNC, *extra], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 2 and "exchange.sync" in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_others_go_on_when_the_reducer_dies(cluster) -> None:
    # every node waited for, as in the same-steps test: a node slowed by the machine's load is
    # not what "included" should count here
    run = [*SYNC, "--set", "exchange.sync_rank=2", "--set", "training.min_peers=2", "--set", "training.max_samples=3200",
           "--set", "training.eval_every=0", "--set", "exchange.sync_wait_for_slow=always"]
    # 50 steps of 64 samples: the reducer killed after 10, the survivors take 40 without it
    nodes, ids = three_nodes(cluster, run)
    reducer = nodes[ids.index(min(ids))]
    wait_for(lambda: all(n.status()["sync"]["rounds"] >= 10 for n in nodes), 120, "10 rounds each")
    reducer.proc.kill()  # SIGKILL: no goodbye
    reducer.proc.wait(10)
    survivors = [n for n in nodes if n is not reducer]
    wait_for(lambda: all(finished(n.status()) for n in survivors), 150, "the survivors done, the final mean taken")
    for n in survivors:
        sync = n.status()["sync"]
        assert sync["last_count"] == 2 and sync["final_count"] == 2, sync
        # the dead reducer is passed over at the first failure: a step or two, not a step per
        # second until membership calls it dead
        assert sync["failures"] <= 4 and sync["included"] >= sync["rounds"] - 4, sync
    for n in survivors:
        n.stop()
    models = [torch.load(n.state_dir / "checkpoint.pt", weights_only=True)["model"] for n in survivors]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])  # the final mean, the same


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("slow", ["the reducer"])
def test_a_straggler_is_not_waited_for_and_keeps_up_by_replaying(cluster, slow: str) -> None:
    """With ``exchange.sync_keep_pace`` off (the default), a node at 30 % speed is not waited for and replays the
    rounds it misses; when it is the
    reducer, it stands down for the next lowest id. Only the reducer is slowed in the suite
    (its time budget): once it has stood down it is a straggler like any other to the stand-in,
    and every assertion of the plain case is made on it. Add "a node" to the parameters to run
    the plain case as well."""
    from benchlib.procs import DutyCycle

    run = [*SYNC, "--set", "exchange.sync_rank=2", "--set", "exchange.sync_timeout=2", "--set", "training.min_peers=2",
           "--set", "training.max_samples=6400", "--set", "training.eval_every=0",
           "--set", "exchange.sync_keep_pace=false"]  # the node slowed keeps its whole batches
    nodes, ids = three_nodes(cluster, run)
    order = sorted(ids)
    straggler = nodes[ids.index(order[0] if slow == "the reducer" else order[-1])]
    reducer = nodes[ids.index(order[1] if slow == "the reducer" else order[0])]  # the one that reduces for it
    wait_for(lambda: all(n.status()["sync"]["rounds"] >= 5 for n in nodes), 120, "5 rounds each")
    assert straggler.proc is not None
    with DutyCycle([straggler.proc.pid], fraction=0.3, period=0.2):  # its daemon and worker at 30 % speed
        wait_for(lambda: all(finished(n.status()) for n in nodes), 150, "every node done, the final mean taken")
    theirs, mine = reducer.status()["sync"], straggler.status()["sync"]
    assert theirs["slow"] == [straggler.status()["node_id"]] and theirs["reduced_here"] > 10, str(theirs)
    assert mine["replayed"] > 10 and mine["failures"] == 0, str(mine)  # it stepped along the rounds it missed
    if slow == "the reducer":  # it stood down: every node, itself too, passed it over
        assert mine["resting_until"] > 0 and theirs["passed_over"] == {order[0]: mine["resting_until"]}, str(mine)
        shown = subprocess.run([sys.executable, "-m", "p2pnode", "status", reducer.addr], capture_output=True,
                               text=True, timeout=60, check=True).stdout
        assert f"passing over {order[0]} until round {mine['resting_until']}" in shown, shown
    steps = [n.status()["training"]["step"] for n in nodes]
    assert len(set(steps)) == 1, steps  # and ended with the others, on the same step
    for n in nodes:
        n.stop()
    models = [torch.load(n.state_dir / "checkpoint.pt", weights_only=True)["model"] for n in nodes]
    for other in models[1:]:
        assert all(torch.equal(models[0][k], other[k]) for k in models[0])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slower_node_trains_on_part_of_its_batch_and_is_in_the_rounds(cluster) -> None:
    """A node at half speed keeps the others' pace (``exchange.sync_keep_pace``) by
    training on a part of each batch: it is in the rounds rather than replaying them, so its
    data counts (with whole batches it missed almost every round: its gradients were dropped,
    and on Dirichlet 0.1 shards that cost 7 pt, docs/archive/BENCHMARKS-history.md, the runs of 2026-11-26 14:40). It ends on
    the others' step with their model."""
    from benchlib.procs import DutyCycle

    run = [*SYNC, "--set", "exchange.sync_rank=2", "--set", "exchange.sync_timeout=2", "--set", "training.min_peers=2",
           "--set", "training.max_samples=6400", "--set", "training.eval_every=0",
           "--set", "exchange.sync_keep_pace=true"]
    # 100 steps of 64 samples: some 95 rounds with the node slowed, over the 50 asked below
    nodes, ids = three_nodes(cluster, run)
    straggler = nodes[ids.index(max(ids))]  # not the reducer
    wait_for(lambda: all(n.status()["sync"]["rounds"] >= 5 for n in nodes), 120, "5 rounds each")
    before = straggler.status()["sync"]
    shares: list[float] = []
    assert straggler.proc is not None
    with DutyCycle([straggler.proc.pid], fraction=0.5, period=0.1):  # its daemon and worker at half speed
        def done() -> bool:
            shares.append(straggler.status()["training"]["batch_share"])
            return all(finished(n.status()) for n in nodes)
        wait_for(done, 150, "every node done, the final mean taken")
    after = straggler.status()["sync"]
    rounds, missed = after["rounds"] - before["rounds"], after["missed"] - before["missed"]
    assert min(shares) < 0.8, shares  # it cut its batches
    assert rounds > 50 and missed < 0.3 * rounds, (rounds, missed, after)  # and was in most rounds
    steps = [n.status()["training"]["step"] for n in nodes]
    assert len(set(steps)) == 1, steps
    for n in nodes:
        n.stop()
    models = [torch.load(n.state_dir / "checkpoint.pt", weights_only=True)["model"] for n in nodes]
    for other in models[1:]:
        assert all(torch.equal(models[0][k], other[k]) for k in models[0])


@pytest.mark.timeout(240)
def test_the_default_picks_the_synchronous_mode_with_a_secret_and_gossip_without(cluster, tmp_path) -> None:
    """``exchange.sync = "auto"``, the default (p2pnode/config/mode_rule.py), on real daemons: two
    torch nodes that share a cluster secret, nothing set for the mode, report the synchronous
    mode in status and run it (all-reduce rounds with both, no gossip exchange); a node without a
    secret reports gossip, and ``p2pnode status`` prints the choice and why."""
    secret = b"auto-mode-secret"
    (tmp_path / "secret").write_bytes(secret + b"\n")
    run = ["--set", f"node.secret_file={tmp_path / 'secret'}", "--set", "training.min_peers=1",
           "--set", "training.max_samples=640", "--set", "training.eval_every=0"]
    a = cluster("a", extra=[*run, "--shard", "0/2"])
    b = cluster("b", seeds=[a.addr], extra=[*run, "--shard", "1/2"])
    open_node = cluster("open", extra=STUB)

    def signed(node) -> dict | None:
        code, _, body = http_request(node.addr, "GET", "/v1/status", secret=secret)
        return json.loads(body) if code == 200 else None

    wait_for(lambda: all((s := signed(n)) is not None and finished(s) for n in (a, b)), 180, "both nodes done")
    for node in (a, b):
        s = signed(node)
        assert s is not None
        mode = s["mode"]
        assert (mode["name"], mode["setting"]) == ("powersgd", "auto") and "cluster secret" in mode["why"], mode
        assert mode["optimizer"] == "SGD" and mode["adaptive"] is False and mode["advice"] is None, mode
        # all-reduce rounds this node's gradient was in (how many, on a loaded machine, varies:
        # a node late for a round is left out of it and replays it; test_three_nodes_... counts)
        assert s["sync"]["rounds"] > 0 and s["sync"]["included"] > 0 and s["bytes"]["sync_received"] > 0, s["sync"]
        assert s["exchanges"]["done"] == 0  # no gossip beside it
        assert "mode powersgd (exchange.sync = auto)" in node.log()
    g = open_node.wait_ready()
    assert (g["mode"]["name"], g["mode"]["setting"]) == ("gossip", "auto") and "no cluster secret" in g["mode"]["why"]
    assert "sync" not in g
    shown = subprocess.run([sys.executable, "-m", "p2pnode", "status", open_node.addr], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    assert "mode      gossip  (exchange.sync = auto: no cluster secret" in shown, shown


@pytest.mark.timeout(240)
def test_an_adaptive_optimizer_takes_int8_values_by_default(cluster) -> None:
    """exchange.sync_values = "auto" (the default): a task that brings AdamW sends int8 (int4
    cost it most of its gap to the all-reduce: docs/ALGORITHMS.md), worker and reducer alike, so
    every round is averaged; the stub workers above (no adaptive optimizer) take int4."""
    run = [*SYNC, "--set", "exchange.sync_timeout=5", "--set", "training.min_peers=1",
           "--set", "training.task=benchlib.tasks.regression:task", "--set", "task.items=1024",
           "--set", "training.lr=0.003", "--set", "training.max_samples=640", "--set", "training.eval_every=0",
           "--set", "exchange.sync_wait_for_slow=always"]
    a = cluster("a", extra=[*run, "--shard", "0/2"])
    a.wait_ready(90)
    b = cluster("b", seeds=[a.addr], extra=[*run, "--shard", "1/2"])
    b.wait_ready(90)
    nodes = [a, b]
    wait_for(lambda: all(finished(n.status()) for n in nodes), 150, "both nodes done")
    steps = a.status()["training"]["step"]
    for n in nodes:
        sync = n.status()["sync"]
        assert sync["values"] == "int8", sync
        assert sync["included"] >= steps - 2 and sync["failures"] == 0 and sync["refused"] == 0, sync
