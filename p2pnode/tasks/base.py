"""The task interface: what a user supplies so that p2pnode trains their model on their data.

A task is an object with five methods (:class:`Task`); the worker owns everything else: the
device, the :class:`~torch.utils.data.DataLoader` and its shuffling, the node's shard of the
data (``training.shard`` / ``training.partition``), the optimizer and its schedule, publishing
and averaging. A task is built by a *factory*, ``factory(ctx) -> Task``, where ``ctx`` is a
:class:`TaskContext` holding the ``[task]`` table of the configuration, so hyperparameters
change without code. docs/TASKS.md shows a complete example.

Why a factory and not a task object: a module is imported by the spawned worker (which owns
torch) and by the preflight probe (``p2pnode start`` checks a task before it joins); building
the task, its model and its data sets is work that must happen there, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset


class TaskError(ValueError):
    """A task that cannot be named, built or used; the message is one line naming the cause."""


@runtime_checkable
class Task(Protocol):
    """What the worker needs from a task. Optional extras, looked up with ``getattr``:

    - ``name: str``: how the task names itself in fingerprints and errors (else the name it was
      configured by);
    - ``labels(dataset) -> Sequence[int] | Tensor | None``: one class index per item of the training set,
      without loading the items; enables ``training.partition`` and the class histogram;
    - ``num_classes: int``: size of that histogram;
    - ``collate(items) -> batch``: the DataLoader's ``collate_fn`` (default: torch's);
    - ``eval_batch_size: int``: batch size of evaluation (default 256);
    - ``optimizer(model, lr) -> torch.optim.Optimizer``: the task's own optimizer (say AdamW
      for a transformer) instead of ``training.optimizer``; the worker still sets each group's
      ``lr`` every step from ``training.lr`` and its warm-up and schedule, and clips gradients;
    - ``keep_local: tuple[str, ...]``: fnmatch patterns of state names that are neither sent nor
      averaged (e.g. ``("*.running_mean", "*.running_var")``: BatchNorm statistics of each
      node's own data); by default every floating-point tensor is (docs/TASKS.md).
    """

    def build_model(self) -> nn.Module:
        """A freshly initialised model. Called after ``torch.manual_seed(training.seed)``, so
        every node of a cluster builds the same initial weights."""
        ...

    def train_data(self) -> Dataset[Any]:
        """All training data (every node sees the same set; the worker takes its shard). Read
        items lazily: the worker reads it through a DataLoader, one batch at a time."""
        ...

    def test_data(self) -> Dataset[Any]:
        """Held-out data for :meth:`evaluate`."""
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar loss of one batch (already on the model's device)."""
        ...

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        """Named metrics over ``batches`` (model in eval mode, no gradients). ``"loss"`` is
        required; classifiers report ``"accuracy"``, language models ``"perplexity"``."""
        ...


@dataclass
class TaskContext:
    """What a factory gets: the ``[task]`` table and the few training keys a task may need.

    Read settings with :meth:`setting`, which coerces a ``--set task.key=value`` string to the
    type of the default; a key of the table that no setting read is refused by name after the
    task is built (a typo must not pass silently)."""

    name: str
    settings: Mapping[str, Any]
    training: Any  # p2pnode.config.TrainingConfig (read it, never change it)
    read: set[str] = field(default_factory=set)

    def setting(self, key: str, default: Any) -> Any:
        """``[task] key`` as the type of ``default`` (bool, int, float, str, list), or ``default``."""
        from p2pnode.config import ConfigError, coerce

        self.read.add(key)
        if key not in self.settings:
            return default
        value = self.settings[key]
        if isinstance(default, list):
            default_type: Any = list[str]  # a comma-separated string or a TOML list of strings
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                return list(value)  # a TOML list of numbers: as it is
        else:
            default_type = type(default)
        try:
            return coerce(f"task.{key}", value, default_type)
        except ConfigError as exc:
            raise TaskError(str(exc)) from None

    def unread(self) -> list[str]:
        return sorted(set(self.settings) - self.read)


#: what ``training.task`` resolves to: called once per worker (and once by the preflight probe)
TaskFactory = Callable[[TaskContext], Task]


class ClassificationTask:
    """A base for classifiers: items are ``(input, class index)`` pairs, the loss is cross
    entropy, evaluation reports ``loss`` and ``accuracy``. Subclasses give the model and data
    (and ``labels`` when they can list the classes without reading the items)."""

    num_classes: int = 10
    eval_batch_size: int = 256

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(self, model: nn.Module, batches: Iterable[Any]) -> dict[str, float]:
        total, correct, loss = 0, 0, 0.0
        for x, y in batches:
            out = model(x)
            loss += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            total += int(y.shape[0])
        return {"loss": loss / max(1, total), "accuracy": correct / max(1, total)}


def dataset_labels(task: Any, dataset: Any) -> Sequence[int] | torch.Tensor | None:
    """The task's labels of ``dataset``, a sequence or a tensor of class indices (None: the
    task has none to give)."""
    fn = getattr(task, "labels", None)
    return None if fn is None else fn(dataset)
