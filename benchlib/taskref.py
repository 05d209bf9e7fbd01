"""A task trained in one process through the node's own trainer (``ShardTrainer``): the
all-reduce reference (every node's data, the same steps at the nodes' global batch: what DDP or
an all-reduce of gradients computes, bar the batch order) and a node alone on its shard.
No daemon: it is what one worker does with no peer, so the figures differ from a cluster's only
in the averaging."""

from __future__ import annotations

from typing import Any

from p2pnode.config import Config


def train_one(settings: dict[str, Any], task: dict[str, Any]) -> dict[str, float]:
    """Train one ShardTrainer under ``settings`` (the [training] table) until done; the task's
    metrics on its whole test set."""
    from p2pnode.worker.training import ShardTrainer

    cfg = Config.from_dict({"training": {"eval_every": 0, **settings}, "task": dict(task)})
    trainer = ShardTrainer(cfg)
    while not trainer.done:
        trainer.train_step()
    trainer.evaluate(0)
    return dict(trainer.metrics)


def reference(settings: dict[str, Any], task: dict[str, Any], nodes: int, samples: int) -> dict[str, float]:
    """One process at ``nodes`` times the batch over ``nodes`` times the samples (all the data,
    whatever the nodes' partition): the same steps."""
    batch = int(settings.get("batch_size", 64)) * nodes
    return train_one({**settings, "shard": "0/1", "partition": "iid", "batch_size": batch, "max_samples": samples * nodes,
                      "warmup_samples": int(settings.get("warmup_samples", 3200)) * nodes}, task)


def alone(settings: dict[str, Any], task: dict[str, Any], nodes: int, samples: int, index: int = 0) -> dict[str, float]:
    """Node ``index`` of ``nodes`` on its shard, with nobody to average with."""
    return train_one({**settings, "shard": f"{index}/{nodes}", "max_samples": samples}, task)


def checkpoint_metrics(state_dirs: list[Any], settings: dict[str, Any], task: dict[str, Any]) -> list[dict[str, float] | None]:
    """Each state dir's final checkpoint evaluated by the task on its whole test set (None: none)."""
    from benchlib.cluster import evaluated_checkpoints

    cfg = Config.from_dict({"training": {"eval_every": 0, **settings, "shard": "0/1", "partition": "iid",
                                         "lr_schedule": "constant"},
                            "task": dict(task)})
    return evaluated_checkpoints(cfg, state_dirs)
