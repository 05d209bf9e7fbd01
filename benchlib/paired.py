"""Two final models judged on the same test images: a paired comparison, not two figures.

Why: the scenario benchmarks ask each run to end within a few tenths of a point of DDP on the same shards. Two
accuracies on the same 10 000 test images differ by chance as much as the two models disagree:
if they are equally good, each image one of them gets right and the other wrong is a coin toss,
so the difference of their figures scatters with a standard deviation of sqrt(b + c) / n, where
b and c count the images only the first, or only the second, gets right. McNemar's exact test
asks whether b and c are further apart than those coin tosses would put them (Dietterich 1998,
"Approximate statistical tests for comparing supervised classification learning algorithms").

``correct(dirs)`` loads final models (p2pnode checkpoints: a node's state dir, or a DDP rank's
``benchlib.ddp`` log folder) and returns, for each, which test images it classifies right;
``compare(a, b)`` is the pure statistics. Loads torch only in ``correct`` (through
``benchlib.steplog.right``, the loop the benchmarks' accuracy figures come from).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Paired:
    """Model A against model B on the same ``n`` images."""

    n: int
    acc_a: float  #: fraction right
    acc_b: float
    only_a: int  #: images A gets right and B wrong (McNemar's b)
    only_b: int  #: images B gets right and A wrong (c)
    p_value: float  #: McNemar's exact two-sided p: how often equally good models differ this much or more

    @property
    def gap_pt(self) -> float:
        """A's accuracy less B's, in points."""
        return 100.0 * (self.only_a - self.only_b) / self.n

    @property
    def chance_sd_pt(self) -> float:
        """The standard deviation, in points, of the gap between two equally good models that
        disagree on this many images: what the test set alone makes a gap scatter by."""
        return 100.0 * math.sqrt(self.only_a + self.only_b) / self.n


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact p of ``b`` against ``c`` discordant pairs: under equal models each is a fair
    coin's count out of b + c, and p is twice the smaller tail (at most 1)."""
    if b < 0 or c < 0:
        raise ValueError(f"counts must be non-negative, not {b} and {c}")
    m = b + c
    if m == 0:
        return 1.0
    k = min(b, c)
    # log-space sum of C(m, i) / 2^m for i <= k: exact enough for m in the thousands
    logs = [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) - m * math.log(2) for i in range(k + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(v - top) for v in logs)
    return min(1.0, 2.0 * tail)


def compare(right_a: np.ndarray, right_b: np.ndarray) -> Paired:
    """A's and B's per-image results (booleans, the same images in the same order) compared."""
    a, b = np.asarray(right_a, dtype=bool), np.asarray(right_b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"two non-empty vectors of one length are needed, not {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    return Paired(n=a.size, acc_a=float(a.mean()), acc_b=float(b.mean()), only_a=only_a, only_b=only_b,
                  p_value=mcnemar_exact(only_a, only_b))


def ddp_run_name(scenario: str, seed: int, partition_seed: int, order: str) -> str:
    """The folder under ``bench_scenarios.py --ddp-save`` where one DDP run keeps its per-step
    records and its final models (``rank0/checkpoint.pt``)."""
    return f"{scenario}-seed{seed}-p{partition_seed}-{order}"


def correct(dirs: list[Path], limit: int = 0) -> list[np.ndarray]:
    """For each folder holding a final model (``checkpoint.pt``, the built-in CNN), which of the
    10 000 Fashion-MNIST test images (the first ``limit``; 0: all) it classifies right."""
    from benchlib.steplog import right
    from p2pnode.checkpoint import CHECKPOINT_NAME, load
    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    test = fashion_mnist(False)
    model = build_model("cnn")
    out: list[np.ndarray] = []
    for d in dirs:
        state = load(Path(d) / CHECKPOINT_NAME)
        if state is None:
            raise FileNotFoundError(f"no model in {d}")
        model.load_state_dict(state["model"])
        out.append(right(model, test, limit).numpy())
    return out
