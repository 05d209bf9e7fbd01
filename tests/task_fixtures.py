"""Small tasks for the task-interface tests, named by import string (``task_fixtures:NAME``):
a good one, one whose loss is not a scalar, one whose model cannot be built, one whose factory
raises, and a model carrying what real models carry (BatchNorm buffers, a frozen layer, tied
weights). Tests put this folder on PYTHONPATH for the nodes they start."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from p2pnode.tasks import ClassificationTask, TaskContext


class Blobs(ClassificationTask):
    """Four Gaussian blobs in 8 dimensions: learnable in a few hundred steps."""

    num_classes = 4

    def __init__(self, ctx: TaskContext, *, vector_loss: bool = False, broken_model: bool = False) -> None:
        self.items = ctx.setting("items", 512)
        self.width = ctx.setting("width", 16)
        if ctx.setting("adam", False):
            self.optimizer = lambda model, lr: torch.optim.Adam(model.parameters(), lr=lr)
        if ctx.setting("local_bn", False):
            self.keep_local = ("*.running_mean", "*.running_var")
        self.vector_loss, self.broken_model = vector_loss, broken_model
        gen = torch.Generator().manual_seed(7)
        self.centres = 2.0 * torch.randn(4, 8, generator=gen)

    def _data(self, n: int, seed: int) -> TensorDataset:
        gen = torch.Generator().manual_seed(seed)
        y = torch.randint(0, 4, (n,), generator=gen)
        return TensorDataset(self.centres[y] + torch.randn(n, 8, generator=gen), y)

    def build_model(self) -> nn.Module:
        if self.broken_model:
            raise RuntimeError("layer size must be positive")
        return Carrier(self.width)

    def train_data(self) -> TensorDataset:
        return self._data(self.items, 1)

    def test_data(self) -> TensorDataset:
        return self._data(256, 2)

    def labels(self, dataset: Any) -> Any:
        return dataset.tensors[1]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        per_item = nn.functional.cross_entropy(model(x), y, reduction="none")
        return per_item if self.vector_loss else per_item.mean()


class Carrier(nn.Module):
    """A BatchNorm layer (float running stats, an integer count), a frozen embedding-like
    layer, and an output layer whose weight is tied to a second module."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.hidden = nn.Linear(8, width)
        self.norm = nn.BatchNorm1d(width)
        self.out = nn.Linear(width, 4)
        self.mirror = nn.Linear(width, 4)
        self.mirror.weight = self.out.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.hidden(x + 0.1 * self.frozen(x))))
        return self.out(h) + 0.0 * self.mirror.bias


def blobs(ctx: TaskContext) -> Blobs:
    return Blobs(ctx)


def vector_loss(ctx: TaskContext) -> Blobs:
    return Blobs(ctx, vector_loss=True)


def broken_model(ctx: TaskContext) -> Blobs:
    return Blobs(ctx, broken_model=True)


def raises(ctx: TaskContext) -> Blobs:
    raise FileNotFoundError("/data/photos does not exist")


def empty(ctx: TaskContext) -> Blobs:
    task = Blobs(ctx)
    task.items = 0
    return task


def half_buffer(ctx: TaskContext) -> Blobs:
    """A model carrying a float64 tensor, which the wire does not carry."""
    task = Blobs(ctx)
    build = task.build_model

    def build_half() -> nn.Module:
        model = build()
        model.register_buffer("scale", torch.ones(3, dtype=torch.float64))
        return model

    task.build_model = build_half  # type: ignore[method-assign]
    return task


class FailsLater(Blobs):
    """Trains, then its loss raises (a bug that shows only on some batch): the worker dies."""

    def __init__(self, ctx: TaskContext) -> None:
        super().__init__(ctx)
        self.calls = 0

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        # training steps only: the BatchNorm refresh before an evaluation runs the loss too,
        # without gradients (p2pnode/worker/batchnorm.py)
        self.calls += torch.is_grad_enabled()
        if self.calls > 40:
            raise RuntimeError("shape mismatch in batch 41")
        return super().loss(model, batch)


def fails_later(ctx: TaskContext) -> Blobs:
    return FailsLater(ctx)
