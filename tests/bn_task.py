"""A task with BatchNorm and nothing else unusual (tests/test_batchnorm_pooled.py), named
``bn_task:blobs``: task_fixtures' four Gaussian blobs through Linear, BatchNorm, ReLU, Linear."""

from __future__ import annotations

from task_fixtures import Blobs
from torch import nn

from p2pnode.tasks import TaskContext


class NormBlobs(Blobs):
    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(8, self.width), nn.BatchNorm1d(self.width), nn.ReLU(), nn.Linear(self.width, 4))


def blobs(ctx: TaskContext) -> NormBlobs:
    return NormBlobs(ctx)
