"""The consensus finish's guard (p2pnode/worker/finish_guard.py): a real torch worker in this
process, trained to the end of its samples; the finish's merged model stood for by the worker's
own model changed in place (zeroed: a merge that lost what the node learned; nudged: a merge that
is a draw), then the daemon's ``Evaluate(consensus=True)`` handled as the pipe delivers it."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import torch
from worker_pipe import drain

from p2pnode.config import Config, set_option
from p2pnode.pipe_protocol import Evaluate, Evaluated
from p2pnode.worker.main import Worker
from p2pnode.worker.public import floating_state


def trained_worker(tmp_path: Path) -> tuple[Worker, list[Evaluated], object, object]:
    cfg = Config()
    for key, value in {"training.data": "synthetic", "training.synthetic_samples": "1024", "training.lr": "0.05",
                       "training.max_samples": "1920", "training.warmup_samples": "0", "training.eval_every": "0",
                       "training.start_settle": "0", "node.state_dir": str(tmp_path)}.items():
        set_option(cfg, key, value)
    cfg = Config.from_dict(cfg.to_dict())
    ours, theirs = mp.Pipe()
    worker = Worker(ours, cfg, "n1")
    evaluated, reader = drain(theirs, Evaluated)
    while not worker.trainer.done:
        worker.step()
    return worker, evaluated, ours, reader


def arrived(evaluated: list[Evaluated], count: int) -> Evaluated:
    """The ``count``-th Evaluated, once the reader thread has it."""
    deadline = time.monotonic() + 20
    while len(evaluated) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(evaluated) >= count, f"{len(evaluated)} evaluations, {count} expected"
    return evaluated[count - 1]


def finish(worker: Worker, evaluated: list[Evaluated]) -> Evaluated:
    before = len(evaluated)
    worker.handle(Evaluate(consensus=True))
    return arrived(evaluated, before + 1)


def test_a_merge_worse_than_our_own_model_is_refused(tmp_path: Path) -> None:
    worker, evaluated, ours, reader = trained_worker(tmp_path)
    own = arrived(evaluated, 1)  # the final figure when training ended
    assert own.samples > 0, own
    kept = {k: v.clone() for k, v in floating_state(worker.trainer.model).items()}
    with torch.no_grad():  # the finish's merge: a model that lost what we learned
        for tensor in floating_state(worker.trainer.model).values():
            tensor.zero_()
    got = finish(worker, evaluated)
    assert got.consensus and got.kept_own
    assert got.accuracy == own.accuracy  # the figures are of our own model again
    for name, tensor in floating_state(worker.trainer.model).items():
        assert torch.equal(tensor, kept[name]), name
    assert worker.guard.kept_own and worker.guard.refused is not None
    assert worker.guard.refused.accuracy < own.accuracy
    ours.close()
    reader.join(10)


def test_a_merge_within_the_noise_is_kept(tmp_path: Path) -> None:
    worker, evaluated, ours, reader = trained_worker(tmp_path)
    arrived(evaluated, 1)
    with torch.no_grad():  # nodes that agree: the merge is a hair from our own model
        for tensor in floating_state(worker.trainer.model).values():
            tensor.mul_(1.0001)
    merged = {k: v.clone() for k, v in floating_state(worker.trainer.model).items()}
    got = finish(worker, evaluated)
    assert got.consensus and not got.kept_own
    assert not worker.guard.kept_own
    for name, tensor in floating_state(worker.trainer.model).items():
        assert torch.equal(tensor, merged[name]), name
    ours.close()
    reader.join(10)


def test_the_rule_asks_two_standard_errors_and_a_loss_that_agrees() -> None:
    from p2pnode.worker.finish_guard import Figures, accuracy_noise, worse

    own = Figures(accuracy=0.87, loss=0.40, samples=2000)
    se = accuracy_noise(0.87, 2000)
    assert worse(Figures(0.87 - 3 * se, 0.45, 2000), own)  # a real loss on both counts
    assert not worse(Figures(0.87 - 1.5 * se, 0.45, 2000), own)  # a draw within the noise
    # seen in a test cluster near chance: accuracy 0.1055 -> 0.0879 on 512 items, the loss 13.3 -> 2.3
    assert not worse(Figures(0.0879, 2.3233, 512), Figures(0.1055, 13.3371, 512))
    # a task without accuracy is judged by its loss
    nan = float("nan")
    assert worse(Figures(nan, 1.05, 100), Figures(nan, 1.0, 100))
    assert not worse(Figures(nan, 1.005, 100), Figures(nan, 1.0, 100))
