"""The learning-quality suite's tasks (scripts/bench_tasks.py): what each trains, at what size,
by which metric it is judged and against which goal.

Every task is sized for a suite of several seeds on a shared 2-core machine, not for
convergence: one 3-node cluster run takes a minute or two there, the reference and the node
alone less. The BatchNorm task is judged on the whole Fashion-MNIST test set (10 000 images):
DDP's trajectory on seed 0, even shards, perturbed five ways (its mean gradient times 1 + noise),
scattered by 1.4 pt (sd) on 1000 test images and by 0.3 pt on 10 000, for a few seconds more
of evaluation; on 1000 the cluster's gap to DDP scattered by 2.6 pt over seeds. Every data set
is offline: Fashion-MNIST from its Debian package (the CNN, and as PNG folders for the
image-folder task), the Python standard library's sources as text (the language model), a
synthetic teacher (the regression).

The goals (the same for every task, stated over seeds): the mean gap to the all-reduce
reference within ``allowed`` (0.5 pt of accuracy, or 2 % of the reference's distance to a
perfect score: R^2 of 1, perplexity of 1), no seed below a node alone, and for tasks trained
with AdamW the cluster at least half way from a node alone to the reference on every seed.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib.testdata import atomic_dir

#: --shards name -> training.partition
SHARDS = {"even": "iid", "dir0.1": "dirichlet:alpha=0.1"}


@dataclass(frozen=True)
class SuiteTask:
    """One task of the suite. ``training``: the [training] keys every run of it sets (the
    cluster's nodes, the reference and the node alone alike); ``task``: its [task] table;
    ``prepare(cache)``: writes its data set once and returns more [task] keys (paths)."""

    name: str
    what: str  #: one line for the section
    training: dict[str, Any]
    task: dict[str, Any]
    samples: int  #: training samples of each node (the reference: nodes x this, at nodes x the batch)
    metric: str  #: the key of the task's evaluate() judged
    higher_is_better: bool
    perfect: float  #: the metric's perfect score (accuracy 1, R^2 1, perplexity 1)
    adamw: bool  #: trained with AdamW: the half-way goal applies
    classifier: bool  #: has labels: run on even and Dirichlet 0.1 shards
    prepare: Callable[[Path], dict[str, Any]] = field(default=lambda cache: {})
    #: has BatchNorm: also anchored to DDP's arithmetic on the nodes' own shards
    #: (benchlib/tasks/ddpref.py), whose ranks, like the nodes, each normalise a batch of their own
    ddp_anchor: bool = False

    def gain(self, value: float, anchor: float) -> float:
        """How much better ``value`` is than ``anchor`` in the metric's own units (> 0: better)."""
        return value - anchor if self.higher_is_better else anchor - value

    def allowed(self, reference: float) -> float:
        """The largest mean shortfall from ``reference`` that meets the goal."""
        if self.metric == "accuracy":
            return 0.005
        return 0.02 * abs(self.perfect - reference)

    def worst(self, values: list[float]) -> float:
        """The cluster's figure: its worst node's."""
        return min(values) if self.higher_is_better else max(values)


def stdlib_text(cache: Path, megabytes: float = 1.0) -> dict[str, Any]:
    """The standard library's top-level module sources, in name order, up to ``megabytes``, as
    one file (what examples/gpt2 reads too): offline text every machine has."""
    def write(tmp: Path) -> None:
        root = Path(sysconfig.get_paths()["stdlib"])
        out, size, limit = [], 0, int(megabytes * 1e6)
        for path in sorted(root.glob("*.py")):
            if size >= limit:
                break
            data = path.read_bytes()[:limit - size]
            out.append(data)
            size += len(data)
        (tmp / "text.txt").write_bytes(b"".join(out))

    folder = atomic_dir(cache / f"suite-stdlib-{megabytes:g}mb", write)
    return {"text": str(folder / "text.txt")}


def fashion_folders(cache: Path, train: int = 300, val: int = 1000) -> dict[str, Any]:
    """Fashion-MNIST as ImageFolder trees, ``train`` (``val``) images of each class: by default
    300 of each class's 6000 training images (a small set, so the suite stays minutes) and all
    1000 of its test images (a figure's standard error about 0.4 pt, where 100 gave 1.4 pt)."""
    from benchlib.testdata import write_fashion_folders

    folder = atomic_dir(cache / f"suite-fashion-folders-{train}-{val}", lambda tmp: write_fashion_folders(tmp, train, val))
    return {"root": str(folder)}


TASKS: dict[str, SuiteTask] = {t.name: t for t in [
    SuiteTask("regression", "benchlib.tasks.regression: MSE, an MLP with LayerNorm and dropout, AdamW, lr 0.003",
              {"task": "benchlib.tasks.regression:task", "lr": 0.003}, {"optimizer": "adamw"},
              samples=24000, metric="r2", higher_is_better=True, perfect=1.0, adamw=True, classifier=False),
    SuiteTask("charlm", "examples/charlm: a byte-level causal transformer (2 layers, width 64, context 64), "
              "AdamW, lr 0.003, batch 32, on 1 MB of the Python standard library's sources",
              {"task": "charlm", "lr": 0.003, "batch_size": 32},
              {"optimizer": "adamw", "context": 64, "dim": 64, "layers": 2, "heads": 4},
              samples=9600, metric="perplexity", higher_is_better=False, perfect=1.0, adamw=True, classifier=False,
              prepare=stdlib_text),
    SuiteTask("imagefolder-bn", "imagefolder: torchvision shufflenet_v2_x0_5 (BatchNorm in every block) at 32x32, "
              "SGD lr 0.1, batch 16, on Fashion-MNIST as PNG folders (300 training images a class; "
              "judged on the whole test set, 1000 images a class)",
              {"task": "imagefolder", "lr": 0.1, "batch_size": 16, "warmup_samples": 0},
              {"model": "shufflenet_v2_x0_5", "image_size": 32, "augment": False},
              samples=3000, metric="accuracy", higher_is_better=True, perfect=1.0, adamw=False, classifier=True,
              prepare=fashion_folders, ddp_anchor=True),
    SuiteTask("cnn", "the built-in CNN on Fashion-MNIST (the defaults: SGD lr 0.2, batch 64)",
              {}, {}, samples=20000, metric="accuracy", higher_is_better=True, perfect=1.0, adamw=False,
              classifier=True),
]}
