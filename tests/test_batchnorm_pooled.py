"""BatchNorm statistics pooled over the cluster at the synchronous mode's models' mean
(p2pnode/worker/main.py ``final_mean``): three real daemons train a model with BatchNorm on
label-skewed shards (Dirichlet 0.1: each node holds one or two of the four classes); after
training every node holds the statistics of all three shards together (the mean over the nodes
of each shard's mean and E[x^2]), not those of its own classes, keeps them through its final
evaluation and checkpoint, and all three report the same accuracy. Before, each node's final
evaluation recomputed them over its own shard: three models with one set of weights evaluated
differently, each with its own classes' statistics (the suite's ShuffleNet on Dirichlet 0.1 shards:
6-28 pt under the same weights with statistics of all the data)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nodes import wait_for

from benchlib.cluster import finished
from p2pnode.config import Config
from p2pnode.worker.batchnorm import batchnorm_layers
from p2pnode.worker.training import ShardTrainer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("training_clusters")]
TESTS = Path(__file__).resolve().parent
TRAINING = {"task": "bn_task:blobs", "device": "cpu", "partition": "dirichlet:alpha=0.1", "batch_size": 32,
            "lr": 0.05, "warmup_samples": 0, "max_samples": 640, "eval_every": 0, "seed": 3}


def own_statistics(model: dict[str, torch.Tensor], shard: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The BatchNorm layer's (mean, var) over ``shard``'s batches for these weights, as a node
    computes them before an evaluation."""
    t = ShardTrainer(Config.from_dict({"training": {**TRAINING, "shard": shard}}))
    t.model.load_state_dict(model)
    assert t.refresh_norms() > 0
    (norm,) = batchnorm_layers(t.model)
    assert norm.running_mean is not None and norm.running_var is not None
    return norm.running_mean.clone(), norm.running_var.clone()


@pytest.mark.timeout(240)
def test_nodes_end_with_the_statistics_of_every_shard(cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # bn_task, for the nodes
    monkeypatch.syspath_prepend(str(TESTS))  # and for this test's own trainers
    run = [*(a for k, v in TRAINING.items() for a in ("--set", f"training.{k}={v}")),
           "--set", "exchange.sync=powersgd", "--set", "exchange.sync_values=float16", "--set", "exchange.sync_timeout=5",
           "--set", "exchange.sync_wait_for_slow=always", "--set", "training.min_peers=2"]
    # all three start at once (the others join through a when it answers; min_peers=2 holds each
    # one's first step until it knows the other two): their workers load torch side by side
    a = cluster("a", extra=[*run, "--shard", "0/3"])
    nodes = [a, *(cluster(f"n{i}", seeds=[a.addr], extra=[*run, "--shard", f"{i}/3"]) for i in (1, 2))]
    for n in nodes:
        n.wait_ready(90)
    wait_for(lambda: all(finished(n.status()) for n in nodes), 150, "every node done, the final mean taken")
    statuses = [n.status() for n in nodes]
    assert all(s["sync"]["final_count"] == 3 for s in statuses), [s["sync"] for s in statuses]
    accuracies = {s["training"]["accuracy"] for s in statuses}
    for n in nodes:
        n.stop()
    models = [torch.load(n.state_dir / "checkpoint.pt", weights_only=True)["model"] for n in nodes]
    assert all(torch.equal(models[0][k], m[k]) for m in models[1:] for k in models[0])  # one model, statistics too
    # one model evaluated with one set of statistics: one figure (each node's own gave three)
    assert len(accuracies) == 1, accuracies
    own = [own_statistics(models[0], f"{i}/3") for i in range(3)]
    mean = torch.stack([m for m, _ in own]).mean(0)
    second = torch.stack([v + m * m for m, v in own]).mean(0)
    held_mean, held_var = models[0]["1.running_mean"], models[0]["1.running_var"]
    assert torch.allclose(held_mean, mean, rtol=1e-3, atol=1e-4), (held_mean, mean)
    assert torch.allclose(held_var, second - mean * mean, rtol=1e-3, atol=1e-4), (held_var, second - mean * mean)
    # the spread between the shards' means is in the variance: not a mean of variances, and no
    # node's own shard's statistics
    assert (held_var - torch.stack([v for _, v in own]).mean(0)).max() > 0.05
    for m, v in own:
        assert not torch.allclose(held_mean, m, atol=0.05) or not torch.allclose(held_var, v, atol=0.05)
