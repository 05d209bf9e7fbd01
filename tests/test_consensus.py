"""The consensus finish: after local training ends, real nodes on skewed shards keep exchanging
until their models agree within ``exchange.consensus_tolerance``, also when one of them dies."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch
from daemon_util import http_request
from nodes import NodeProc, wait_for

pytestmark = pytest.mark.slow

TOL = 0.01
# Three nodes, each on about one third of the classes, diverging quickly (lr 0.1), 48 steps each.
SKEWED = ["--set", "training.partition=classes:k=1", "--set", "training.lr=0.1",
          "--set", "training.max_samples=3072", "--set", f"exchange.consensus_tolerance={TOL}",
          "--set", "training.eval_every=0"]


def model_of(node: NodeProc) -> dict[str, torch.Tensor]:
    state = torch.load(node.state_dir / "checkpoint.pt", weights_only=True)
    return {k: v.float() for k, v in state["model"].items() if v.is_floating_point()}


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    diff = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a)
    norm = sum(float((a[k] ** 2).sum()) for k in a)
    return math.sqrt(diff / norm)


def start_three(cluster, extra: list[str]) -> list[NodeProc]:
    """Three nodes started at once (b and c join through a when it answers): waiting for a first
    left it training alone for the seconds the others took to load their worker."""
    a = cluster("a", extra=["--shard", "0/3", *SKEWED, *extra])
    nodes = [a] + [cluster(n, seeds=[a.addr], extra=["--shard", f"{i}/3", *SKEWED, *extra])
                   for i, n in ((1, "b"), (2, "c"))]
    for n in nodes:
        n.wait_ready(90)
    return nodes


def agreed(node: NodeProc) -> bool:
    """The node says it agrees with every peer it exchanges with now (a peer briefly left out on
    a loaded machine is not counted: the checkpoints below are the real check)."""
    c = node.status()["consensus"]
    return bool(c["reached"]) and c["peers"] >= 1 and c["max_distance"] is not None


def end_of_training_accuracy(node: NodeProc) -> float:
    """The figure the worker sent when its training ended, before the finish's averages (the
    last evaluation the log does not say is of the agreed model)."""
    lines = [ln for ln in node.log_path.read_text().splitlines()
             if "test accuracy" in ln and "the model agreed on" not in ln]
    return float(lines[-1].split("test accuracy ")[1].split()[0])


@pytest.mark.timeout(240)
def test_nodes_end_with_one_model(cluster, tmp_path: Path) -> None:
    nodes = start_three(cluster, [])
    # Status shows each node's class histogram; the three shards split the data set exactly.
    from p2pnode.data import synthetic
    from p2pnode.partition import histogram

    shards = [n.status()["training"]["classes"] for n in nodes]
    whole = histogram(synthetic(2048, seed=1).labels.numpy(), 10)
    assert [sum(col) for col in zip(*shards)] == whole
    assert all(sum(1 for c in h if c) <= 5 for h in shards)  # about a third of the classes each
    # the cluster view compares them: each node's classes are its own, and gossip is told of
    # the mode measured for such data
    view = json.loads(http_request(nodes[0].addr, "GET", "/v1/cluster")[2])
    skew = {r["node_id"]: r["label_skew"] for r in view["nodes"]}
    assert len(skew) == 3 and all(v is not None and v > 0.2 for v in skew.values()), view["nodes"]
    assert view["advice"] and 'exchange.sync = "powersgd"' in view["advice"]
    # and every node says it once in its log, for an operator who never opens the dashboard
    for n in nodes:
        wait_for(lambda n=n: "label distributions differ" in n.log_path.read_text(), 30, f"{n.name}'s advice")
    for n in nodes:
        wait_for(lambda n=n: n.status()["training"]["done"], 60, f"{n.name} to finish training")
    for n in nodes:
        wait_for(lambda n=n: agreed(n), 60, f"{n.name} to agree with its peers")
        assert n.status()["consensus"]["max_distance"] <= TOL
    # each node reports the agreed model's figure, not its own shard's model's at the end of training
    agreed_figures = [wait_for(lambda n=n: (t := n.status()["training"])["eval_consensus"] and t, 30,
                               f"{n.name} to evaluate the agreed model") for n in nodes]
    ends = [end_of_training_accuracy(n) for n in nodes]
    accs = [t["accuracy"] for t in agreed_figures]
    # The finish's guard (worker/finish_guard.py) may refuse the merge on a node whose own model
    # measured better by over two standard errors, its loss lower too: near chance on these
    # shards (own 23 %, merged 16 % on 512 items) it did, in one CI run of several. That node
    # reports its own model's figure, and the others the merged one's.
    kept = [bool(t["finish_kept_own"]) for t in agreed_figures]
    print(f"accuracy at the end of training {ends}, of the agreed model {accs}, kept own {kept}")
    merged = [a for a, k in zip(accs, kept) if not k]
    assert len(merged) >= 2 and max(merged) - min(merged) <= 0.03, (accs, ends, kept)
    assert all(abs(a - e) < 1e-3 for a, e, k in zip(accs, ends, kept) if k), (accs, ends, kept)
    assert all(t["eval_step"] == t["step"] for t in agreed_figures), agreed_figures
    for n in nodes:
        n.stop()  # SIGTERM: final checkpoint
    models = [model_of(n) for n in nodes]
    # Each node measured itself against its peers' public copies; the merged models themselves
    # agree too (a node that kept its own has its own model, by design).
    for i in range(3):
        for j in range(i + 1, 3):
            if not (kept[i] or kept[j]):
                assert distance(models[i], models[j]) <= 2.5 * TOL, (i, j, distance(models[i], models[j]))


@pytest.mark.timeout(240)
def test_survivors_agree_when_a_node_dies(cluster) -> None:
    a, b, c = start_three(cluster, [])
    wait_for(lambda: c.status()["training"]["step"] >= 10, 40, "c to train a little")
    c.signal(signal.SIGKILL)
    c.proc.wait(5)
    for n in (a, b):
        wait_for(lambda n=n: n.status()["training"]["done"], 60, f"{n.name} to finish training")
    for n in (a, b):
        wait_for(lambda n=n: agreed(n), 60, f"{n.name} to agree with the other survivor")
    for n in (a, b):
        n.stop()
    assert distance(model_of(a), model_of(b)) <= 2.5 * TOL


@pytest.mark.timeout(240)
def test_a_node_that_trained_before_meeting_its_peers_keeps_its_model(cluster) -> None:
    """A start (bootstrap) not taken by the end of training is not taken: b's first round comes
    after its 48 steps (exchange.every = 64), and it must not then swap its trained model for a
    peer's copy (seen on a fast machine with the defaults: two nodes took the seed's copy of its
    step ~12 after their training, and the three never agreed)."""
    a = cluster("a", extra=["--shard", "0/3", *SKEWED])
    b = cluster("b", seeds=[a.addr], extra=["--shard", "1/3", *SKEWED, "--set", "exchange.every=64",
                                            "--set", "exchange.max_lead=0"])
    c = cluster("c", seeds=[a.addr], extra=["--shard", "2/3", *SKEWED])
    nodes = [a, b, c]
    for n in nodes:
        n.wait_ready(90)
    wait_for(lambda: b.status()["bootstrap"]["state"] != "pending", 60, "b's start to settle")
    boot = b.status()["bootstrap"]
    assert boot["state"] == "own" and boot["detail"] == "training ended first", boot
    for n in nodes:
        wait_for(lambda n=n: n.status()["training"]["done"], 60, f"{n.name} to finish training")
    for n in nodes:
        wait_for(lambda n=n: agreed(n), 60, f"{n.name} to agree with its peers")
    assert "started from" not in b.log_path.read_text()
