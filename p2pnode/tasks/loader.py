"""The worker's side of a task's data: this node's shard, the DataLoaders, the device.

The worker owns the reading: a task gives a map-style Dataset and the worker takes the
node's shard of it (``training.shard`` under ``training.partition``), reads it through a
DataLoader in shuffled batches (``training.loader_workers`` processes; 0 reads in the worker
itself) and moves each batch to ``training.device``. Items are read as batches are drawn, so a
data set on disk is never held in memory as a whole.

The batch order is the one the trainer drew before the task interface (a fresh
``randperm`` of the shard each pass, the tail that does not fill a batch left out), so the
built-in tasks train on exactly the batches they did.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from p2pnode.config import parse_shard
from p2pnode.tasks.base import TaskError, dataset_labels


@dataclass
class Shard:
    """This node's share of the training data; ``labels`` is empty when the task has none."""

    dataset: Dataset[Any]
    labels: torch.Tensor  # int64 class index per item of ``dataset`` (empty: no labels)
    size: int

    def __len__(self) -> int:
        return self.size


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA GPU when there is one, else the CPU; ``cpu``; ``cuda[:i]``
    (refused with one line when that GPU is not there)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TaskError(f"training.device: {name} asked for, but torch sees no CUDA GPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise TaskError(f"training.device: {name} asked for, but there are {torch.cuda.device_count()} GPUs")
    return device


def take_shard(task: Any, dataset: Dataset[Any], shard: str, partition: str, seed: int) -> Shard:
    """The ``shard`` ("i/n") of ``dataset`` under ``partition``; a partition other than iid
    needs the task's labels. Raises TaskError for an empty data set or shard."""
    from p2pnode import partition as parts

    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise TaskError("its training data set is empty")
    index, count = parse_shard(shard)
    raw = dataset_labels(task, dataset)
    labels = torch.as_tensor(np.asarray(raw), dtype=torch.long) if raw is not None else torch.empty(0, dtype=torch.long)
    if raw is not None and len(labels) != n:
        raise TaskError(f"labels() gave {len(labels)} labels for {n} training items")
    part = parts.parse(partition)
    if raw is None and part.kind != "iid":
        raise TaskError(f"training.partition {partition!r} needs labels, and this task gives none")
    if count == 1 and part.kind == "iid":
        return Shard(dataset, labels, n)
    try:
        idx = parts.shard_indices(labels.numpy() if raw is not None else np.zeros(n, dtype=np.int64), part, index,
                                  count, seed)
    except parts.PartitionError as exc:
        raise TaskError(f"training.partition: {exc}") from None
    if len(idx) == 0:
        raise TaskError(f"shard {shard} of its {n} training items is empty")
    chosen = idx.tolist()
    return Shard(Subset(dataset, chosen), labels[torch.from_numpy(idx)] if raw is not None else labels, len(chosen))


class EndlessBatches(Sampler[list[int]]):
    """Shuffled batches of indices forever: a new permutation each pass, a short tail skipped.
    ``skip``: start after that many batches, exactly where a sampler that drew them would be
    (the same permutations drawn from the generator): a node resumed or rejoining goes on
    through its shard instead of seeing its first batches again."""

    def __init__(self, size: int, batch_size: int, generator: torch.Generator, skip: int = 0) -> None:
        self.size, self.batch_size, self.generator, self.skip = size, batch_size, generator, skip

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.size, generator=self.generator)
        per_pass = max(1, self.size // self.batch_size)
        for _ in range(self.skip // per_pass):  # whole passes: only their permutations
            order = torch.randperm(self.size, generator=self.generator)
        pos = (self.skip % per_pass) * self.batch_size
        while True:
            if pos + self.batch_size > len(order):
                order = torch.randperm(self.size, generator=self.generator)
                pos = 0
            yield order[pos:pos + self.batch_size].tolist()
            pos += self.batch_size


def train_batches(task: Any, shard: Shard, batch_size: int, generator: torch.Generator,
                  workers: int, skip: int = 0) -> Iterator[Any]:
    """One endless iterator over the shard's batches (still on the CPU), after the first ``skip``."""
    # The loader's own generator seeds its reader processes: drawing that seed from torch's
    # global generator would shift every random number drawn after it.
    seeds = torch.Generator().manual_seed(generator.initial_seed() + 1)
    loader = DataLoader(shard.dataset, batch_sampler=EndlessBatches(len(shard), batch_size, generator, skip),
                        num_workers=workers, collate_fn=getattr(task, "collate", None),
                        persistent_workers=workers > 0, generator=seeds)
    return iter(loader)


def eval_batches(task: Any, dataset: Dataset[Any], limit: int, device: torch.device) -> tuple[Iterator[Any], int]:
    """Batches of the first ``limit`` items of ``dataset`` (0: all) on ``device``, and their count."""
    n = len(dataset)  # type: ignore[arg-type]
    n = n if not limit else min(limit, n)
    subset = dataset if n == len(dataset) else Subset(dataset, range(n))  # type: ignore[arg-type]
    loader = DataLoader(subset, batch_size=int(getattr(task, "eval_batch_size", 256)), shuffle=False,
                        collate_fn=getattr(task, "collate", None))
    return (to_device(batch, device) for batch in loader), n


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it (in tuples, lists and dicts) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device) for b in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def head(batch: Any, k: int) -> Any:
    """The first ``k`` items of a batch: every tensor whose first dimension is the batch's cut to
    ``k``, through tuples, lists and dicts; anything else as it is."""
    n = batch_len(batch)

    def cut(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x[:k] if x.dim() and x.shape[0] == n else x
        if isinstance(x, (list, tuple)):
            items = [cut(v) for v in x]
            return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)  # a namedtuple takes fields
        if isinstance(x, dict):
            return {key: cut(v) for key, v in x.items()}
        return x

    return cut(batch)


def batch_len(batch: Any) -> int:
    """Items in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (list, tuple)) and batch:
        return batch_len(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_len(next(iter(batch.values())))
    raise TaskError(f"cannot tell how many items a batch of type {type(batch).__name__} holds")
