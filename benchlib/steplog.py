"""Per-step records of a baseline trainer process (DDP, hivemind), in the experiment's format.

Each rank of ``benchlib.ddp`` or ``benchlib.hivemind_run`` given a log folder appends one JSON
line per step to ``DIR/rank{R}.jsonl``: ``{"t": seconds since training began, "step", "samples",
"loss", "acc"}`` where ``acc`` is the test accuracy on the first ``EVAL_IMAGES`` test images every
``eval_every`` steps (None otherwise; the time it takes is training time for everyone, as it
is for a p2pnode node's periodic evaluation), and at the end saves its model as a p2pnode
checkpoint (``DIR/rank{R}/checkpoint.pt``) so the same evaluator reads every system's final
model. Loads torch: for trainer processes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: test images per periodic evaluation (p2pnode nodes use training.eval_samples = the same)
EVAL_IMAGES = 1000


class StepLog:
    def __init__(self, folder: str, rank: int, eval_every: int, test: Any, batch: int = 64) -> None:
        self.folder = Path(folder) if folder else None
        self.rank = rank
        self.eval_every = eval_every
        self.test = test
        self.batch = batch
        self.start = time.monotonic()
        self.lines: list[str] = []

    def begin(self) -> None:
        self.start = time.monotonic()

    def step(self, step: int, loss: float, model: Any) -> None:
        """After step ``step`` (1-based) with that batch's ``loss``."""
        if self.folder is None:
            return
        acc = None
        if self.eval_every and step % self.eval_every == 0:
            acc = evaluate(model, self.test, EVAL_IMAGES)
        self.lines.append(json.dumps({"t": round(time.monotonic() - self.start, 4), "step": step,
                                      "samples": step * self.batch, "loss": round(float(loss), 5), "acc": acc}))

    def close(self, model: Any) -> None:
        """Write the records and the final model."""
        if self.folder is None:
            return
        import torch

        from p2pnode import checkpoint

        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{self.rank}.jsonl").write_text("\n".join(self.lines) + "\n")
        inner = model.module if hasattr(model, "module") else model
        state = {k: v.detach().cpu() for k, v in inner.state_dict().items() if isinstance(v, torch.Tensor)}
        checkpoint.save(self.folder / f"rank{self.rank}" / checkpoint.CHECKPOINT_NAME, {"model": state})


def right(model: Any, split: Any, limit: int = 0) -> Any:
    """Which of the first ``limit`` items of ``split`` (0: all) ``model`` classifies right (a
    bool tensor): the per-image view benchlib/paired.py compares two models by."""
    import torch

    n = len(split) if not limit else min(limit, len(split))
    was = model.training
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(split.images[i:min(n, i + 1000)]).argmax(1) for i in range(0, n, 1000)])
    model.train(was)
    return pred == split.labels[:n]


def evaluate(model: Any, split: Any, limit: int = 0) -> float:
    """Accuracy of ``model`` on the first ``limit`` items of ``split`` (0: all)."""
    hits = right(model, split, limit)
    return int(hits.sum()) / max(1, len(hits))


def evaluate_checkpoints(train_images: int, dirs: list[Path | None]) -> list[dict[str, float | None]]:
    """Each final model (the built-in CNN) on the 10 000 test images and the first
    ``train_images`` training images (None: a model that stands for nothing, as a parameter
    server's workers' copies). Every core: nothing else of the experiment runs meanwhile."""
    import torch

    from p2pnode.checkpoint import CHECKPOINT_NAME, load
    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    torch.set_num_threads(os.cpu_count() or 1)
    test, train = fashion_mnist(False), fashion_mnist(True)
    model = build_model("cnn")
    out: list[dict[str, float | None]] = []
    for d in dirs:
        state = load(d / CHECKPOINT_NAME) if d is not None else None
        if state is None:
            out.append({"test_acc": None, "train_acc": None})
            continue
        model.load_state_dict(state["model"])
        out.append({"test_acc": evaluate(model, test), "train_acc": evaluate(model, train, train_images)})
    return out
