"""A task made ready for training: resolved, built, its shard taken, its device chosen.

Both the worker (:class:`p2pnode.worker.training.ShardTrainer`) and the preflight probe
(:mod:`p2pnode.tasks.probe`) load a task through :func:`load`, so what ``p2pnode start`` checks
before it joins is what the worker will do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from p2pnode.config import Config
from p2pnode.tasks.base import Task, TaskError
from p2pnode.tasks.loader import Shard, resolve_device, take_shard
from p2pnode.tasks.registry import build_task, configured_name, first_line, task_label

#: longest task name carried in a fingerprint (the wire bounds ids at 256 characters)
MAX_LABEL = 200


@dataclass
class LoadedTask:
    task: Task
    label: str  # how the task names itself (fingerprints, messages)
    shard: Shard  # this node's training data
    test: Dataset[Any]
    device: torch.device


def load(cfg: Config) -> LoadedTask:
    """Build ``training.task`` with the ``[task]`` table; raises TaskError (or DataError)."""
    t = cfg.training
    label = configured_name(t)
    try:
        task, ctx = build_task(t, cfg.task)
        label = task_label(task, ctx)[:MAX_LABEL]
        device = resolve_device(t.device)
        shard = take_shard(task, _call(task.train_data), t.shard, t.partition, t.partition_seed)
        test = _call(task.test_data)
        if len(test) == 0:  # type: ignore[arg-type]
            raise TaskError("its test data set is empty")
    except TaskError as exc:
        raise TaskError(f"task {label!r}: {exc}") from None
    return LoadedTask(task, label, shard, test, device)


def _call(method: Any) -> Any:
    """A task's method, its exception (other than ours or a DataError) made one line."""
    try:
        return method()
    except Exception as exc:
        from p2pnode.data import DataError

        if isinstance(exc, (TaskError, DataError)):
            raise
        raise TaskError(f"{method.__name__}() raised {type(exc).__name__}: {first_line(exc)}") from None


def fingerprint(label: str, model: nn.Module) -> str:
    """``TASK@HASH``: the task's name, then a short hash of the state's names, shapes and
    dtypes. Nodes whose fingerprints differ refuse each other's models, and the refusal
    names both tasks (p2pnode.wire.payload.mismatch)."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return f"{label}@{h.hexdigest()[:16]}"


def check_loss(loss: Any) -> None:
    """A task's loss must be a scalar tensor that carries a gradient."""
    if not isinstance(loss, torch.Tensor):
        raise TaskError(f"loss() returned {type(loss).__name__}, not a tensor")
    if loss.dim() != 0:
        raise TaskError(f"loss() returned a tensor of shape {tuple(loss.shape)}, not a scalar")
