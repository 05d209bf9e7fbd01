"""DDP's arithmetic on the cluster's own shards, for a task with BatchNorm: ``nodes`` ranks, each
the node's ShardTrainer (its shard, its batch stream, batch and schedule), each computing its
gradient on its own batch with BatchNorm normalising that batch alone (DDP without SyncBatchNorm:
each rank's statistics are its batch's), the gradients averaged exactly, and every rank taking
the same step. Computed in one process, rank after rank: the numbers DDP over gloo computes, bar
float summation order, without its processes and sockets.

Why a second anchor: the suite's reference is one process at the nodes' global batch, whose
BatchNorm normalises a batch of all the data. Nodes (and DDP's ranks) each normalise a batch of
their own shard only, so on label-skewed shards even an exact all-reduce of gradients trains a
different model. This anchor tells what an exact all-reduce reaches on the same shards, so a gap
to it is the network's (compression, stragglers), and the rest is BatchNorm's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from p2pnode.config import Config

if TYPE_CHECKING:
    from p2pnode.worker.training import ShardTrainer


def ddp_reference(settings: dict[str, Any], task: dict[str, Any], nodes: int, samples: int) -> dict[str, float]:
    """Train ``nodes`` ranks on shards i/nodes of ``settings``' partition as DDP does; rank 0's
    model evaluated on the whole test set after its BatchNorm statistics are recomputed over the
    whole training data (as the suite evaluates a cluster's checkpoints)."""
    from p2pnode.worker.training import ShardTrainer

    ranks = [ShardTrainer(Config.from_dict({"training": {"eval_every": 0, **settings, "shard": f"{i}/{nodes}",
                                                         "max_samples": samples}, "task": dict(task)}))
             for i in range(nodes)]
    while not ranks[0].done:
        for r in ranks:
            backward(r)
        with torch.no_grad():
            for params in zip(*(r.model.parameters() for r in ranks)):
                if params[0].grad is None:
                    continue
                mean = torch.stack([p.grad for p in params]).mean(0)
                for p in params:
                    p.grad.copy_(mean)
        for r in ranks:
            r._clip_and_step()
    return checkpoint_metrics_of(ranks[0].model.state_dict(), settings, task)


def backward(t: ShardTrainer) -> None:
    """ShardTrainer.train_step up to the gradients (no reduce, no step): a full batch of the
    rank's stream at the schedule's learning rate, counted as a step. Shared by the in-process
    studies that combine the ranks' gradients themselves (here, scripts/study_sync_adam.py)."""
    t.model.train()
    batch = t._next_batch()
    lr = t.lr_now()
    for group in t.optimizer.param_groups:
        group["lr"] = lr
    t.optimizer.zero_grad(set_to_none=False)
    loss = t.task.loss(t.model, batch)
    t.step += 1
    t.last_batch = t.cfg.training.batch_size
    t.samples += t.last_batch
    loss.backward()


def checkpoint_metrics_of(state: dict[str, Any], settings: dict[str, Any], task: dict[str, Any]) -> dict[str, float]:
    """A model state evaluated as the suite evaluates a cluster's final checkpoint
    (benchlib.taskref.checkpoint_metrics: BatchNorm statistics over the whole training data)."""
    from p2pnode.worker.training import ShardTrainer

    cfg = Config.from_dict({"training": {"eval_every": 0, **settings, "shard": "0/1", "partition": "iid",
                                         "lr_schedule": "constant"}, "task": dict(task)})
    trainer = ShardTrainer(cfg)
    trainer.model.load_state_dict(state)
    trainer.evaluate(0)
    return dict(trainer.metrics)
