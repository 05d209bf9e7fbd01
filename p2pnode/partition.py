"""How n nodes split one labelled training set with no coordination: IID, label skew, few classes.

Every node computes the *whole* partition from the same inputs (the labels, ``n`` and
``training.partition_seed``) and keeps part ``i`` (``training.shard = "i/n"``), so n nodes on n
machines get disjoint shards that together cover the data, without talking to each other.

- ``iid``: interleaved shards ``i, i + n, i + 2n, ...`` — an even, shuffled-looking share.
- ``dirichlet:alpha=A``: for each class, the proportions that go to the n nodes are drawn from
  Dir(A, ..., A), the federated-learning standard for label skew (Hsu, Qi, Brown 2019; the
  NIID-Bench set-up of Li et al. 2022). Small A (0.1) gives each node a few dominant classes and
  unequal sizes; large A tends to IID. As in NIID-Bench the draw is repeated (deterministically)
  until every node has at least ``min(10, N // n)`` samples.
- ``classes:k=K``: the "pathological" split of McMahan et al. 2017: sort by label, cut into
  n·K equal chunks, give each node K chunks at random; each node sees about K classes.

numpy only: configuration validation parses these specs without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("iid", "dirichlet", "classes")
#: label distributions this far apart (``distance``) are *unlike*: each node's classes are
#: more or less its own. Of 4 nodes' shards of Fashion-MNIST (partition seeds 0-5), even ones
#: are 0.007-0.011 from the others', Dirichlet 0.5 0.37-0.69, Dirichlet 0.1 0.62-0.97, two
#: classes a node 0.80-0.93 (docs/ALGORITHMS.md, "Synchronous PowerSGD"). The synchronous mode waits
#: for a slow node this unlike the rest (sync/lateness.py); the cluster view advises it
#: (dashboard/cluster.py)
UNLIKE = 0.2


class PartitionError(ValueError):
    """A partition spec that cannot be parsed, or a shard it would leave empty."""


@dataclass(frozen=True)
class Partition:
    kind: str = "iid"
    alpha: float = 0.0  # dirichlet
    k: int = 0  # classes

    def __str__(self) -> str:
        if self.kind == "dirichlet":
            return f"dirichlet:alpha={self.alpha:g}"
        if self.kind == "classes":
            return f"classes:k={self.k}"
        return "iid"


def parse(spec: str) -> Partition:
    """``"iid"``, ``"dirichlet:alpha=0.1"`` or ``"classes:k=2"``; raises PartitionError."""
    kind, _, rest = spec.strip().partition(":")
    if kind not in KINDS:
        raise PartitionError(f"{spec!r}: kind must be one of {', '.join(KINDS)}")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PartitionError(f"{spec!r}: expected KEY=VALUE, got {item!r}")
        params[key.strip()] = value.strip()
    want = {"iid": set(), "dirichlet": {"alpha"}, "classes": {"k"}}[kind]
    if set(params) != want:
        needs = ", ".join(sorted(want)) or "no parameters"
        raise PartitionError(f"{spec!r}: {kind} takes {needs}")
    if kind == "dirichlet":
        try:
            alpha = float(params["alpha"])
        except ValueError:
            raise PartitionError(f"{spec!r}: alpha must be a number") from None
        if not (0 < alpha < float("inf")):
            raise PartitionError(f"{spec!r}: alpha must be a finite number > 0")
        return Partition("dirichlet", alpha=alpha)
    if kind == "classes":
        if not params["k"].isdigit() or int(params["k"]) < 1:
            raise PartitionError(f"{spec!r}: k must be a whole number >= 1")
        return Partition("classes", k=int(params["k"]))
    return Partition()


def assign(labels: np.ndarray, part: Partition, count: int, seed: int) -> list[np.ndarray]:
    """All ``count`` shards' sample indices (sorted), disjoint and together covering the data
    (``iid`` and ``dirichlet``; ``classes`` too, as its chunks cover every sample)."""
    labels = np.asarray(labels).reshape(-1)
    n_samples = len(labels)
    if count < 1:
        raise PartitionError(f"need at least one shard, got {count}")
    if part.kind == "iid":
        return [np.arange(i, n_samples, count) for i in range(count)]
    rng = np.random.default_rng(seed)
    if part.kind == "classes":
        chunks = part.k * count
        if chunks > n_samples:
            raise PartitionError(f"classes:k={part.k} needs {chunks} samples for {count} nodes; the data has {n_samples}")
        pieces = np.array_split(np.argsort(labels, kind="stable"), chunks)
        order = rng.permutation(chunks)
        return [np.sort(np.concatenate([pieces[j] for j in order[i * part.k:(i + 1) * part.k]]))
                for i in range(count)]
    min_size = min(10, n_samples // count)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(1000):
        shards: list[list[np.ndarray]] = [[] for _ in range(count)]
        for idx in by_class:
            idx = rng.permutation(idx)
            cuts = (np.cumsum(rng.dirichlet([part.alpha] * count))[:-1] * len(idx)).astype(np.int64)
            for i, piece in enumerate(np.split(idx, cuts)):
                shards[i].append(piece)
        out = [np.sort(np.concatenate(s)) for s in shards]
        if min(len(s) for s in out) >= min_size:
            return out
    raise PartitionError(f"{part} over {count} nodes leaves a node with under {min_size} samples "
                         "in 1000 draws; use a larger alpha or fewer nodes")


def shard_indices(labels: np.ndarray, part: Partition, index: int, count: int, seed: int) -> np.ndarray:
    """The sample indices of shard ``index`` of ``count``."""
    if not 0 <= index < count:
        raise PartitionError(f"bad shard {index}/{count}: need 0 <= i < n")
    return assign(labels, part, count, seed)[index]


def histogram(labels: np.ndarray, classes: int | None = None) -> list[int]:
    """Samples per class (index = class), for status and the partition tests."""
    labels = np.asarray(labels).reshape(-1)
    size = classes if classes is not None else (int(labels.max()) + 1 if len(labels) else 0)
    return np.bincount(labels, minlength=size).tolist()


def distance(mine: list[int], others: list[list[int]]) -> float | None:
    """Total variation distance between the histogram ``mine`` and the sum of those ``others``
    of its length (another task's) as distributions (0: the same mix of classes, 1: no class in
    common); None where either is empty."""
    alike = [o for o in others if len(o) == len(mine)]
    if not alike:
        return None
    pooled = [sum(col) for col in zip(*alike)]
    a, b = sum(mine), sum(pooled)
    if a <= 0 or b <= 0:
        return None
    return 0.5 * sum(abs(x / a - y / b) for x, y in zip(mine, pooled))
