"""The learning-quality suite's regression task (benchlib/tasks/regression.py), written from
docs/TASKS.md as a user would: its metric is R^2 as defined, and the worker's own trainer
learns it through the task's AdamW hook."""

from __future__ import annotations

import torch
from torch import nn

from benchlib.taskref import train_one
from benchlib.tasks.regression import Regression
from p2pnode.config import Config
from p2pnode.tasks.base import TaskContext


def make(**settings: object) -> Regression:
    return Regression(TaskContext("regression", dict(settings), Config().training))


class Oracle(nn.Module):
    """Predicts what it is told: the targets themselves, or their mean."""

    def __init__(self, values: torch.Tensor) -> None:
        super().__init__()
        self.values = values
        self.at = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.values[self.at:self.at + x.shape[0]]
        self.at += x.shape[0]
        return out


def test_r2_is_one_for_the_targets_and_zero_for_their_mean() -> None:
    task = make(items=512)
    data = task.test_data()
    x, y = data.tensors
    batches = [(x[i:i + 100], y[i:i + 100]) for i in range(0, len(y), 100)]
    assert task.evaluate(Oracle(y.clone()), batches)["r2"] == 1.0
    mean = task.evaluate(Oracle(torch.full_like(y, float(y.mean()))), batches)
    assert abs(mean["r2"]) < 1e-4 and mean["loss"] > 0.5


def test_the_worker_learns_it_with_the_tasks_adamw() -> None:
    settings = {"task": "benchlib.tasks.regression:task", "lr": 0.003, "seed": 0, "device": "cpu",
                "max_samples": 3200, "warmup_samples": 320}
    metrics = train_one(settings, {"items": 3200})
    assert metrics["r2"] > 0.4, metrics
    assert isinstance(make().optimizer(make().build_model(), 0.01), torch.optim.AdamW)


def test_a_gossip_node_with_an_adaptive_optimizer_is_told_what_was_measured(caplog: object) -> None:
    from p2pnode.config import set_option
    from p2pnode.worker.training import advise_adaptive

    params = [nn.Parameter(torch.zeros(2))]
    gossip, trusted, chosen = Config(), Config(), Config()  # "auto" without a secret: gossip
    set_option(trusted, "node.secret", "s")  # "auto" with one: the synchronous mode
    set_option(chosen, "node.secret", "s")
    set_option(chosen, "exchange.sync", "none")  # gossip by hand, a secret or not
    assert advise_adaptive(torch.optim.AdamW(params), gossip)
    assert "cluster secret" in caplog.text  # type: ignore[attr-defined]
    assert advise_adaptive(torch.optim.Adam(params), chosen)
    assert 'exchange.sync = "auto" or "powersgd"' in caplog.text  # type: ignore[attr-defined]
    assert not advise_adaptive(torch.optim.AdamW(params), trusted)  # the mode it is told to use
    assert not advise_adaptive(torch.optim.SGD(params, lr=0.1, momentum=0.9), gossip)
