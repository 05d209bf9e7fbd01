"""A regression task written from docs/TASKS.md as a user would write one: tabular data, MSE, an
MLP with LayerNorm and dropout, its own metric (R^2), and AdamW through the task's ``optimizer``
hook. The data are synthetic and offline: 32 features, the target a fixed random teacher network
of them plus noise, so that a perfect model reaches R^2 of about 0.95 (the rest is noise).

    p2pnode start --set training.task=benchlib.tasks.regression:task --set training.lr=0.003 ...

Settings (``[task]``): ``items`` (training items, 72 000: 3 nodes x 24 000), ``optimizer``
(``adamw``, or ``sgd``: momentum 0.9), ``width`` (256), ``dropout`` (0.1), ``noise`` (0.22:
the target's noise, as a share of its standard deviation)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from p2pnode.tasks import TaskContext

FEATURES = 32
TEST_ITEMS = 8000


class Regression:
    """MSE regression on a teacher network's output; ``evaluate`` gives ``loss`` and ``r2``."""

    name = "regression"

    def __init__(self, ctx: TaskContext) -> None:
        self.items = ctx.setting("items", 72000)
        self.width = ctx.setting("width", 256)
        self.dropout = ctx.setting("dropout", 0.1)
        self.noise = ctx.setting("noise", 0.22)
        kind = ctx.setting("optimizer", "adamw")
        if kind not in ("adamw", "sgd"):
            raise ValueError(f"task.optimizer must be adamw or sgd, not {kind!r}")
        self.kind = kind
        gen = torch.Generator().manual_seed(1234)
        # the teacher: two tanh layers, features mixed by a random matrix (correlated inputs)
        self.mix = torch.randn(FEATURES, FEATURES, generator=gen) / FEATURES ** 0.5
        self.w1 = torch.randn(FEATURES, 64, generator=gen) / FEATURES ** 0.5
        self.w2 = torch.randn(64, 1, generator=gen) / 8.0
        x = torch.randn(20000, FEATURES, generator=gen) @ self.mix
        clean = self._clean(x)
        self.mean, self.std = float(clean.mean()), float(clean.std())

    def _clean(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(2.0 * x @ self.w1) @ self.w2 + 0.3 * x[:, :1] * x[:, 1:2]

    def _data(self, n: int, seed: int) -> TensorDataset:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, FEATURES, generator=gen) @ self.mix
        y = (self._clean(x) - self.mean) / self.std
        y = y + self.noise * torch.randn(n, 1, generator=gen)
        return TensorDataset(x, y)

    def build_model(self) -> nn.Module:
        w, p = self.width, self.dropout
        return nn.Sequential(nn.Linear(FEATURES, w), nn.LayerNorm(w), nn.GELU(), nn.Dropout(p),
                             nn.Linear(w, w), nn.LayerNorm(w), nn.GELU(), nn.Dropout(p), nn.Linear(w, 1))

    def train_data(self) -> TensorDataset:
        return self._data(self.items, 1)

    def test_data(self) -> TensorDataset:
        return self._data(TEST_ITEMS, 2)

    def optimizer(self, model: nn.Module, lr: float) -> torch.optim.Optimizer:
        if self.kind == "sgd":
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    def evaluate(self, model: nn.Module, batches: Any) -> dict[str, float]:
        sse, total, sum_y, sum_y2, n = 0.0, 0.0, 0.0, 0.0, 0
        for x, y in batches:
            pred = model(x)
            sse += float(((pred - y) ** 2).sum())
            sum_y += float(y.sum())
            sum_y2 += float((y * y).sum())
            n += y.shape[0]
        total = sum_y2 - sum_y * sum_y / max(n, 1)
        return {"loss": sse / max(n, 1), "r2": 1.0 - sse / max(total, 1e-12)}


def task(ctx: TaskContext) -> Regression:
    return Regression(ctx)
