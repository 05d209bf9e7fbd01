"""Naming a task: ``training.task`` is an import string or a short name.

- ``"my_pkg.tasks:photos"`` (as uvicorn and Flower name apps): import ``my_pkg.tasks`` and take
  its attribute ``photos``, a factory ``photos(ctx) -> Task`` (a class whose constructor takes
  the context is one);
- a short name: one of p2pnode's own (:data:`BUILTIN_TASKS`) or one that an installed package
  registers under the entry-point group ``p2pnode.tasks``
  (``[project.entry-points."p2pnode.tasks"] charlm = "p2pnode_charlm:task"``);
- empty (the default): the built-in task that ``training.model`` and ``training.data`` name.

This module imports nothing heavy at import time (the daemon names tasks in its messages and
must stay torch-free); :func:`build_task` imports the task, and with it torch, in the worker or
the preflight probe only.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2pnode.tasks.base import Task, TaskContext

#: the entry-point group an installed package registers its tasks under
ENTRY_POINT_GROUP = "p2pnode.tasks"

#: p2pnode's own tasks by short name
BUILTIN_TASKS: dict[str, str] = {
    "builtin": "p2pnode.tasks.builtin:builtin",
    "imagefolder": "p2pnode.tasks.vision:imagefolder",
}


def configured_name(training: Any) -> str:
    """The task's name as configured: ``training.task``, or ``builtin`` when it is empty."""
    return str(training.task) or "builtin"


def resolve(name: str) -> Any:
    """The factory that ``name`` names; raises TaskError saying why it does not resolve."""
    from p2pnode.tasks.base import TaskError

    target = name
    if ":" not in name:
        if name in BUILTIN_TASKS:
            target = BUILTIN_TASKS[name]
        else:
            found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
            if not found:
                known = sorted({*BUILTIN_TASKS, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
                raise TaskError(f"no task named {name!r} (known: {', '.join(known)}; or write MODULE:ATTRIBUTE)")
            target = found[0].value
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskError(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the module itself raised while importing
        raise TaskError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TaskError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TaskError(f"{target} is not a factory (a callable taking the task context)")
    return obj


def build_task(training: Any, settings: dict[str, Any]) -> tuple[Task, TaskContext]:
    """Resolve and call the factory of ``training.task`` with the ``[task]`` table; raises
    TaskError (one line) when the name does not resolve, the factory raises, the result lacks
    the interface, or a setting was not read."""
    from p2pnode.tasks.base import TaskContext, TaskError

    name = configured_name(training)
    factory = resolve(name)
    ctx = TaskContext(name=name, settings=dict(settings), training=training)
    try:
        task = factory(ctx)
    except Exception as exc:
        from p2pnode.data import DataError

        if isinstance(exc, (TaskError, DataError)):  # already one line naming the cause
            raise
        raise TaskError(f"building it raised {type(exc).__name__}: {first_line(exc)}") from None
    missing = [m for m in ("build_model", "train_data", "test_data", "loss", "evaluate")
               if not callable(getattr(task, m, None))]
    if missing:
        raise TaskError(f"{type(task).__name__} lacks {', '.join(missing)} (see docs/TASKS.md)")
    unread = ctx.unread()
    if unread:
        reads = ", ".join(sorted(ctx.read)) or "none"
        raise TaskError(f"task.{unread[0]} is not a setting of this task (it reads: {reads})")
    return task, ctx


def task_label(task: Any, ctx: TaskContext) -> str:
    """How a built task names itself in fingerprints and messages."""
    own = getattr(task, "name", None)
    return str(own) if own else ctx.name


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]
