"""A task of any size whose compute is cheap: what ``scripts/bench_model_size.py`` trains, so that
the time goes to the exchange path (encode, send, decode, apply), not to forward passes.

``training.task = "benchlib.sizetask:task"`` (the node runs from the repository root, so the
import string resolves), ``task.params`` the parameter count wanted. The model is ``k`` square
linear layers side by side (not stacked): ``y = mean_i(W_i x)``, batch 1, a regression on
synthetic vectors. Every layer's gradient is the outer product of the output error and the input,
dense and of the same scale in every layer (stacked layers would vanish with depth and publish
near-zero deltas), and a step costs about 6 x params floating-point operations: a matrix-vector
product per layer forward, two backward.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from p2pnode.tasks import TaskContext, TaskError


def shape_for(params: int) -> tuple[int, int]:
    """(width, layers) of the model closest to ``params`` parameters: 1024-wide layers below
    4M parameters, 2048-wide above (1M: 1 x 1024²; 17M: 4 x 2048²; 124M: 30; 350M: 83)."""
    width = 1024 if params < 4_000_000 else 2048
    return width, max(1, round(params / (width * width)))


class SideBySide(nn.Module):
    """``layers`` square linear maps of ``width``, applied to the same input and averaged."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.maps = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.maps[0](x)
        for m in self.maps[1:]:
            out = out + m(x)
        return out / len(self.maps)


class SizeTask:
    """Model, synthetic data, mean squared error."""

    name = "sizetask"
    eval_batch_size = 16

    def __init__(self, ctx: TaskContext) -> None:
        params = ctx.setting("params", 1_000_000)
        if params < 1:
            raise TaskError("task.params must be >= 1")
        self.width, self.layers = shape_for(params)
        g = torch.Generator().manual_seed(11)
        self.target = torch.randn(self.width, self.width, generator=g) / self.width ** 0.5
        self.items = ctx.setting("items", 256)

    def _data(self, n: int, seed: int) -> TensorDataset:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, self.width, generator=g)
        return TensorDataset(x, x @ self.target.T)

    def build_model(self) -> nn.Module:
        return SideBySide(self.width, self.layers)

    def train_data(self) -> TensorDataset:
        return self._data(self.items, 1)

    def test_data(self) -> TensorDataset:
        return self._data(32, 2)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        total, n = 0.0, 0
        for x, y in batches:
            total += float(F.mse_loss(model(x), y, reduction="sum")) / self.width
            n += int(x.shape[0])
        return {"loss": total / max(1, n)}


def task(ctx: TaskContext) -> SizeTask:
    """The factory ``training.task`` names."""
    return SizeTask(ctx)
