"""Tasks: a user's model, data, loss and metrics, trained by p2pnode (docs/TASKS.md).

``from p2pnode.tasks import Task, TaskContext, ClassificationTask`` for writing one. The
names are loaded on first use: the daemon imports :mod:`p2pnode.tasks.registry` and
:mod:`p2pnode.tasks.check` to name and check tasks, and must not import torch by doing so.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ClassificationTask", "Task", "TaskContext", "TaskError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("p2pnode.tasks.base"), name)
    raise AttributeError(f"module 'p2pnode.tasks' has no attribute {name!r}")
