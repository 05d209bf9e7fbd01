"""p2pnode's original tasks, written against the task interface: the models of
``training.model`` (cnn, resnet18, vgg11, vgg19) on the data of ``training.data``
(fashion-mnist, cifar10, synthetic). ``training.task = ""`` (the default) and ``"builtin"`` name
this factory, so the demo, the tests and every benchmark train through the same interface a
user's task does.

These data sets are small and already held as normalised tensors (p2pnode/data.py); they are
wrapped as a :class:`TensorSplit` dataset whose ``__getitems__`` indexes a whole batch at once,
which the DataLoader uses instead of one item at a time (the same tensors the trainer indexed
before the interface, so the same batches and the same numbers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from p2pnode import data as datasets
from p2pnode.models import build_model
from p2pnode.tasks.base import ClassificationTask, TaskContext


class TensorSplit(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A :class:`p2pnode.data.Split` as a map-style dataset; batches are sliced in one go."""

    def __init__(self, split: datasets.Split) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.images[i], self.split.labels[i]

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(idx, dtype=torch.long)
        return self.split.images[index], self.split.labels[index]


def batched(batch: Any) -> Any:
    """The collate function for :class:`TensorSplit`: its ``__getitems__`` already batched."""
    return batch


class BuiltinTask(ClassificationTask):
    """One of the built-in model/data pairs; settings come from ``[training]``, not ``[task]``."""

    eval_batch_size = 1000

    def __init__(self, model: str, data: str, data_dir: str, synthetic_samples: int) -> None:
        self.model_name, self.data = model, data
        self.name = f"{model}/{data}"
        self.num_classes = 10
        self.collate = batched
        source = Path(data_dir) if data_dir else None
        if data == "fashion-mnist":
            train, test = datasets.fashion_mnist(True, source), datasets.fashion_mnist(False, source)
        elif data == "cifar10":
            if source is None:
                raise datasets.DataError("training.data_dir: required for cifar10")
            train, test = datasets.cifar10(True, source), datasets.cifar10(False, source)
        else:
            shape = (1, 28, 28) if model == "cnn" else (3, 32, 32)
            train = datasets.synthetic(synthetic_samples, seed=1, shape=shape)
            test = datasets.synthetic(max(256, synthetic_samples // 4), seed=2, shape=shape)
        self.train, self.test = TensorSplit(train), TensorSplit(test)

    def build_model(self) -> nn.Module:
        return build_model(self.model_name, in_channels=int(self.train.split.images.shape[1]))

    def train_data(self) -> TensorSplit:
        return self.train

    def test_data(self) -> TensorSplit:
        return self.test

    def labels(self, dataset: Any) -> torch.Tensor | None:
        return dataset.split.labels if isinstance(dataset, TensorSplit) else None


def builtin(ctx: TaskContext) -> BuiltinTask:
    """The factory behind ``training.task = ""`` / ``"builtin"``."""
    t = ctx.training
    return BuiltinTask(t.model, t.data, t.data_dir, t.synthetic_samples)
