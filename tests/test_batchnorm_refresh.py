"""BatchNorm statistics recomputed before an evaluation (p2pnode/worker/batchnorm.py,
``training.bn_refresh``): the running statistics become the plain mean of the batches' own,
for the weights as they are; nothing else moves (weights, momenta, mode, the training stream);
a model without BatchNorm is left alone. The daemons' case (three nodes evaluating at chance
without it) is tests/test_tasks_cluster.py's image-folder test."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from p2pnode.config import Config
from p2pnode.worker.batchnorm import batchnorm_layers, refresh_batchnorm
from p2pnode.worker.training import ShardTrainer

TESTS = Path(__file__).resolve().parent


def net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))


def run(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch)


def test_the_statistics_become_the_mean_of_the_batches_own() -> None:
    model = net().eval()
    torch.manual_seed(1)
    batches = [torch.randn(5, 2, 6, 6) * (1 + i) + i for i in range(3)]
    conv, bn = model[0], model[1]
    bn.running_mean.fill_(7.0)  # stale statistics, of some other model
    bn.running_var.fill_(9.0)
    weights = copy.deepcopy([p.detach().clone() for p in model.parameters()])
    assert refresh_batchnorm(model, iter(batches), 3, run) == 3
    with torch.no_grad():
        outs = [conv(b) for b in batches]
    means = torch.stack([o.mean(dim=(0, 2, 3)) for o in outs]).mean(0)
    variances = torch.stack([o.transpose(0, 1).reshape(3, -1).var(dim=1, unbiased=True) for o in outs]).mean(0)
    assert torch.allclose(bn.running_mean, means, atol=1e-5)
    assert torch.allclose(bn.running_var, variances, atol=1e-4)
    assert bn.momentum == 0.1 and not model.training  # put back as they were
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_only_count_batches_are_run_and_the_mode_is_kept() -> None:
    model = net().train()
    seen: list[int] = []

    def counting(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        seen.append(len(seen))
        return m(b)

    batches = (torch.randn(4, 2, 6, 6) for _ in range(100))
    assert refresh_batchnorm(model, batches, 5, counting) == 5
    assert seen == [0, 1, 2, 3, 4] and model.training


def test_a_model_without_batchnorm_and_an_empty_stream_change_nothing() -> None:
    plain = nn.Sequential(nn.Linear(3, 2))
    assert batchnorm_layers(plain) == []
    assert refresh_batchnorm(plain, iter([torch.randn(2, 3)]), 4, run) == 0
    model = net()
    model[1].running_mean.fill_(2.0)
    assert refresh_batchnorm(model, iter([]), 4, run) == 0
    assert torch.equal(model[1].running_mean, torch.full((3,), 2.0))  # not reset to zeros
    assert refresh_batchnorm(model, iter([torch.randn(2, 2, 6, 6)]), 0, run) == 0  # count 0: off


def trainer(refresh: int) -> ShardTrainer:
    return ShardTrainer(Config.from_dict({"training": {
        "task": "task_fixtures:blobs", "device": "cpu", "warmup_samples": 0, "lr": 0.05, "batch_size": 32,
        "bn_refresh": refresh}}))


@pytest.mark.parametrize("refresh", [0, 4])
def test_a_trainer_refreshes_before_evaluating_and_trains_on_unchanged(
        refresh: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    t = trainer(refresh)
    for _ in range(3):
        t.train_step()
    norm = batchnorm_layers(t.model)[0]
    norm.running_mean.fill_(50.0)  # as an average with a far peer's statistics might leave them
    params = [p.detach().clone() for p in t.model.parameters()]
    drawn = t.drawn
    t.evaluate(64)
    assert all(torch.equal(a, b) for a, b in zip(params, t.model.parameters()))
    assert t.drawn == drawn  # the refresh draws from a stream of its own
    refreshed = not torch.equal(norm.running_mean, torch.full_like(norm.running_mean, 50.0))
    assert refreshed == bool(refresh)
    # the next training batch is the one it would have been without the evaluation
    twin = trainer(refresh)
    for _ in range(3):
        twin.train_step()
    assert torch.equal(t._next_batch()[0], twin._next_batch()[0])
