"""A worker whose loss turns non-finite recovers within a few steps (model restored from its
public copy, step size halved) instead of repeating the same divergence for hundreds of steps."""

from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

from worker_pipe import drain

from p2pnode.config import Config, set_option
from p2pnode.pipe_protocol import Progress
from p2pnode.worker.main import Worker
from p2pnode.worker.training import RECOVERY_STEPS


def test_a_diverging_worker_recovers_in_a_few_steps(tmp_path: Path) -> None:
    cfg = Config()
    for key, value in {"training.data": "synthetic", "training.synthetic_samples": "512", "training.lr": "3000",
                       "training.warmup_samples": "0", "training.eval_every": "0",
                       "training.grad_clip": "0",  # clipping (the default) would keep lr 3000 finite
                       "node.state_dir": str(tmp_path)}.items():
        set_option(cfg, key, value)
    cfg = Config.from_dict(cfg.to_dict())
    ours, theirs = mp.Pipe()
    worker = Worker(ours, cfg, "n1")
    progress, reader = drain(theirs, Progress)
    for _ in range(RECOVERY_STEPS + 60):
        worker.step()
    ours.close()
    reader.join(10)
    bad = [i for i, p in enumerate(progress) if not math.isfinite(p.loss)]
    assert bad, f"lr 3000 should diverge: the test would show nothing ({len(progress)} steps, last losses {[p.loss for p in progress[-3:]]})"
    # Each divergence halves the step; after a handful the loss stays finite for good.
    assert len(bad) <= 12, f"{len(bad)} non-finite steps"
    assert bad[-1] < 60, f"still diverging at step {bad[-1]}"
    assert progress[bad[-1]].lr < 3000 * 0.5 ** (len(bad) - 1) * 1.0001  # reported, halved each time
    assert progress[-1].nonfinite == len(bad)
    assert all(math.isfinite(p.loss) for p in progress[bad[-1] + 1:])
    # and the halved step grows back after RECOVERY_STEPS finite steps (160 - 60 >= 100 of them)
    assert worker.trainer.lr_scale > progress[bad[-1]].lr / 3000
