"""The baseline: PyTorch DDP over gloo, the same small CNN and shards as a p2pnode cluster
(Fashion-MNIST, batch 64 per worker, momentum SGD, cosine schedule, 1 thread per worker).

``run_ddp(DdpRun(...), place)`` starts one process per rank (``python -m benchlib.ddp``, with
``place(rank)``'s command prefix: loopback, or a network namespace) and returns rank 0's
result: seconds of training, test accuracy of the (identical) final models, and the bytes
all-reduce moved (ring all-reduce: each worker sends 2 (n - 1) / n of the gradient bytes a
step; all workers counted). A failure (a rank killed with ``kill_at``: gloo's "connection
reset") or a hang comes back as ``failed``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

from benchlib.cluster import ROOT, Place, loopback


#: what the baselines fix in their code rather than take as a run field (benchlib.hivemind_run
#: takes the same): a batch of 64 a worker, momentum SGD, a cosine schedule, one torch thread
BATCH = 64
MOMENTUM = 0.9
FIXED: dict[str, object] = {"batch_size": BATCH, "optimizer": "sgd", "momentum": MOMENTUM, "lr_schedule": "cosine",
                            "threads": 1}


@dataclass
class DdpRun:
    """What one DDP run does; every field is also a ``python -m benchlib.ddp`` option."""

    workers: int = 4
    samples: int = 30000  #: training samples per worker
    lr: float = 0.2
    port: int = 29533  #: rank 0's rendezvous port
    max_seconds: float = 0.0  #: > 0: all ranks stop after this much training (thin links); no accuracy then
    kill_at: int = 0  #: > 0: the last rank SIGKILLs itself at this step, as a machine dying would
    partition: str = "iid"  #: training.partition of the p2pnode run it is compared with (same shards)
    partition_seed: int = 0
    log_dir: str = ""  #: where each rank writes its per-step records and final model (benchlib/steplog.py)
    eval_every: int = 0  #: with log_dir: rank 0 evaluates every this many steps
    seed: int = 0  #: the initial model and every rank's batch order (repeats of a benchmark: 0, 1, 2...)
    #: p2pnode's defaults (training.warmup_samples, training.grad_clip), so both systems take the
    #: same steps: without them DDP at lr 0.2 and momentum 0.9 ended at chance with seed 1 (IID)
    warmup_samples: int = 3200
    grad_clip: float = 5.0
    #: DDP's bucket size in MiB; 0: DDP's default (25, with a first bucket of 1). Another size
    #: moves where each gradient element sits in the ring all-reduce's chunks, so its four-way sum
    #: is taken in another order: the same run to within float32 rounding, which shows how far
    #: rounding alone moves a seed's result. (Any size given, 25 too, drops the small first
    #: bucket: DDP makes it only when bucket_cap_mb is left unset)
    bucket_cap_mb: float = 0.0
    #: the ranks' batch orders: "own" (drawn here) or "p2pnode" (from the generator a node of the
    #: same shard and training.seed draws its batches from, p2pnode/worker/training.py): then DDP and
    #: a p2pnode run start from the same model and see the same batches in the same order
    order: str = "own"

    @property
    def steps(self) -> int:
        return self.samples // BATCH


def run_ddp(run: DdpRun, place: Place = loopback, wait: float = 3600.0,
            env: dict[str, str] | None = None,
            on_start: Callable[[list[subprocess.Popen[str]]], Any] | None = None) -> dict[str, Any]:
    """Run every rank in its own process and return rank 0's result (a dict with ``seconds``,
    ``accuracy``, ``sent``, ``steps``, ``of_steps``; or ``failed`` with what went wrong).
    ``on_start(procs)`` is called once every rank's process runs (e.g. to slow one down); what it
    returns, if a context manager, is entered then and exited when the run ends."""
    from p2pnode.daemon.supervisor import (
        WORKER_MALLOC_ENV,  # the allocator settings p2pnode's workers get
    )

    master = place(0)[1]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **WORKER_MALLOC_ENV, **(env or {})}
    opts = [a for f in fields(DdpRun) for a in (f"--{f.name.replace('_', '-')}", str(getattr(run, f.name)))]
    procs = [subprocess.Popen([*place(r)[0], sys.executable, "-m", "benchlib.ddp", "--rank", str(r),
                               "--master", master, *opts],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT)
             for r in range(run.workers)]
    deadline = time.monotonic() + wait
    outs: list[tuple[str, str]] = []
    hooks = contextlib.ExitStack()
    hook = on_start(procs) if on_start is not None else None
    if hook is not None and hasattr(hook, "__exit__"):
        hooks.enter_context(hook)
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        return {"failed": f"no result after {wait:.0f} s: the workers hung", "steps": 0, "of_steps": run.steps}
    finally:
        hooks.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = outs[0][0].strip().splitlines()
    if not lines:
        return {"failed": f"rank 0 exited with {procs[0].returncode}: {outs[0][1][-2000:]}", "steps": 0,
                "of_steps": run.steps}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --- one rank (in its own process) ----------------------------------------------------------


def batch_stream_seed(run: DdpRun, rank: int) -> int:
    """The seed of a rank's batch order (``DdpRun.order``)."""
    if run.order == "p2pnode":
        from p2pnode.worker.training import batch_seed

        return batch_seed(run.seed, rank)
    return rank + 1 + 1000 * run.seed


def batch_stream(size: int, seed: int) -> Iterator[Any]:
    """Batches of indices forever, as a p2pnode node draws them from the same seed: p2pnode's
    own sampler (a new permutation each pass, a short tail skipped)."""
    import torch

    from p2pnode.tasks.loader import EndlessBatches

    return (torch.tensor(b) for b in EndlessBatches(size, BATCH, torch.Generator().manual_seed(seed)))


def _train(model: Any, opt: Any, train: Any, run: DdpRun, rank: int, start: float, progress: list[int],
           steplog: Any = None) -> int:
    """The training loop; returns the steps done (fewer when ``max_seconds`` struck)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    batches = batch_stream(len(train), batch_stream_seed(run, rank))
    kill_at = run.kill_at if rank == run.workers - 1 else 0
    for step in range(run.steps):
        progress[0] = step
        if kill_at and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if run.max_seconds > 0 and step % 10 == 0 and step:  # every rank agrees on stopping
            flag = torch.tensor([float(time.monotonic() - start > run.max_seconds)])
            dist.all_reduce(flag)
            if flag.item() > 0:
                return step
        idx = next(batches)
        lr = run.lr * 0.5 * (1 + math.cos(math.pi * step / run.steps))
        if step * BATCH < run.warmup_samples:  # p2pnode's linear warm-up (p2pnode/worker/training.py)
            lr *= (step * BATCH + BATCH) / (run.warmup_samples + BATCH)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = F.cross_entropy(model(train.images[idx]), train.labels[idx])
        loss.backward()
        if run.grad_clip > 0:  # of the all-reduced gradient, as p2pnode clips each node's own
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.grad_clip)
        opt.step()
        if steplog is not None:
            steplog.step(step + 1, float(loss.detach()), model)
    return run.steps


def rank_main(run: DdpRun, rank: int, master: str) -> dict[str, Any] | None:
    """One DDP worker; rank 0 returns what it measured."""
    import torch
    import torch.distributed as dist

    from p2pnode.data import fashion_mnist, shard
    from p2pnode.models import build_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(run.port))
    dist.init_process_group("gloo", rank=rank, world_size=run.workers)
    train = shard(fashion_mnist(True), rank, run.workers, run.partition, run.partition_seed)
    torch.manual_seed(run.seed)
    model = torch.nn.parallel.DistributedDataParallel(build_model("cnn"), bucket_cap_mb=run.bucket_cap_mb or None)
    opt = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=MOMENTUM)
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    from benchlib.steplog import StepLog

    steplog = StepLog(run.log_dir, rank, run.eval_every if rank == 0 else 0,
                      fashion_mnist(False) if rank == 0 and run.log_dir else None) if run.log_dir else None
    dist.barrier()
    start = time.monotonic()
    if steplog is not None:
        steplog.begin()
    progress = [0]
    try:
        done = _train(model, opt, train, run, rank, start, progress, steplog)
    except RuntimeError as exc:  # gloo's errors (DistBackendError is one) when a peer is gone
        return {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                "seconds": time.monotonic() - start, "steps": progress[0], "of_steps": run.steps}
    dist.barrier()
    elapsed = time.monotonic() - start
    if steplog is not None:
        steplog.close(model)
    result = None
    if rank == 0:
        accuracy = float("nan")
        if done == run.steps:
            test = fashion_mnist(False)
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(test.images[i:i + 1000]).argmax(1) == test.labels[i:i + 1000]).sum())
                              for i in range(0, len(test), 1000))
            accuracy = correct / len(test)
        sent = run.workers * done * grad_bytes * 2 * (run.workers - 1) / run.workers
        result = {"seconds": elapsed, "accuracy": accuracy, "sent": sent, "steps": done, "of_steps": run.steps,
                  **asdict(run)}
    dist.destroy_process_group()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description="one DDP rank (benchlib.ddp.run_ddp starts them)")
    for f in fields(DdpRun):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--master", default="127.0.0.1", help="rank 0's host")
    args = ap.parse_args()
    run = DdpRun(**{f.name: getattr(args, f.name) for f in fields(DdpRun)})
    result = rank_main(run, args.rank, args.master)
    if result is not None and args.rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
