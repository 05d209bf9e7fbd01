"""Baseline: PyTorch DDP over gloo on loopback, the same small CNN and shards as p2pnode's
cluster benchmark (4 workers x 30 000 Fashion-MNIST samples, batch 64 each, momentum SGD,
cosine schedule, 1 thread per worker). Prints training time, test accuracy of the (identical)
final models and the bytes all-reduce moved (ring all-reduce: each worker sends
2 (n - 1) / n of the gradient bytes per step; we count what all workers send).

    .venv/bin/python scripts/bench_ddp.py [--workers 4] [--samples 30000] [--lr 0.2]

With --rank, runs only that worker in this process (scripts/bench_thin.py starts one per network
namespace that way); rank 0 prints its result as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pnode.daemon.trainer import WORKER_MALLOC_ENV  # noqa: E402
from p2pnode.data import fashion_mnist, shard  # noqa: E402
from p2pnode.models import build_model  # noqa: E402


class Progress:
    """How far training got, readable after the loop was broken off by an error."""

    step: int = 0


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, train: Any, gen: torch.Generator, steps: int,
           lr: float, start: float, max_seconds: float, kill_at: int, progress: Progress) -> int:
    """The training loop; returns the number of steps done."""
    order, pos = torch.randperm(len(train), generator=gen), 0
    for step in range(steps):
        progress.step = step
        if kill_at and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if max_seconds > 0 and step % 10 == 0 and step:
            flag = torch.tensor([float(time.monotonic() - start > max_seconds)])
            dist.all_reduce(flag)
            if flag.item() > 0:
                return step
        if pos + 64 > len(order):
            order, pos = torch.randperm(len(train), generator=gen), 0
        idx = order[pos:pos + 64]
        pos += 64
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.zero_grad()
        F.cross_entropy(model(train.images[idx]), train.labels[idx]).backward()
        opt.step()
    return steps


def worker(rank: int, world: int, samples: int, lr: float, master: str, out: mp.Queue | None,
           max_seconds: float = 0.0, kill_at: int = 0) -> dict[str, Any] | None:
    """One DDP worker; rank 0 returns (and puts on ``out``) what it measured.

    ``max_seconds`` > 0 stops every worker after that much training (all ranks agree through an
    all-reduce of the flag every 10 steps), for links so thin a full run would take too long;
    the result then says how many steps were done and the accuracy is left out.
    ``kill_at`` > 0: the last rank SIGKILLs itself at that step, as a machine dying would; rank 0
    then reports what DDP did about it (the error and when, if it did not hang)."""
    torch.set_num_threads(1)
    host, _, port = master.rpartition(":")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    train = shard(fashion_mnist(True), rank, world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model("cnn"))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(rank + 1)
    steps = samples // 64
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    dist.barrier()
    start = time.monotonic()
    progress = Progress()
    try:
        done = _train(model, opt, train, gen, steps, lr, start, max_seconds,
                      kill_at if rank == world - 1 else 0, progress)
    except RuntimeError as exc:  # gloo's errors (DistBackendError is one) when a peer is gone
        result = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                  "seconds": time.monotonic() - start, "steps": progress.step, "of_steps": steps}
        if rank == 0 and out is not None:
            out.put(result)
        return result if rank == 0 else None
    dist.barrier()
    elapsed = time.monotonic() - start
    result = None
    if rank == 0:
        accuracy = float("nan")
        if done == steps:
            test = fashion_mnist(False)
            model.eval()
            with torch.no_grad():
                correct = sum(int((model(test.images[i:i + 1000]).argmax(1) == test.labels[i:i + 1000]).sum())
                              for i in range(0, len(test), 1000))
            accuracy = correct / len(test)
        sent = world * done * grad_bytes * 2 * (world - 1) / world
        result = {"seconds": elapsed, "accuracy": accuracy, "sent": sent, "steps": done, "of_steps": steps}
        if out is not None:
            out.put(result)
    dist.destroy_process_group()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--master", default="127.0.0.1:29533", help="HOST:PORT of rank 0's rendezvous")
    ap.add_argument("--rank", type=int, default=-1, help="run only this worker, in this process")
    ap.add_argument("--max-seconds", type=float, default=0.0, help="stop training after this long (0: never)")
    ap.add_argument("--kill-at", type=int, default=0,
                    help="SIGKILL the last worker at this step and report what the others do")
    ap.add_argument("--wait", type=float, default=1800, help="give up on a result after this many seconds")
    args = ap.parse_args()
    os.environ.update(WORKER_MALLOC_ENV)  # the same allocator settings p2pnode's workers get
    if args.rank >= 0:
        result = worker(args.rank, args.workers, args.samples, args.lr, args.master, None, args.max_seconds,
                        args.kill_at)
        if result is not None:
            print(json.dumps(result), flush=True)
        return 0
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.workers, args.samples, args.lr, args.master, out,
                                              args.max_seconds, args.kill_at))
             for r in range(args.workers)]
    for p in procs:
        p.start()
    try:
        r = out.get(timeout=args.wait)
    except queue.Empty:
        r = None
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    if r is None:
        print(f"DDP gloo: no result after {args.wait:.0f} s: the workers hung")
        return 1
    if "failed" in r:
        print(f"DDP gloo: training failed at step {r['steps']} of {r['of_steps']}, {r['seconds']:.1f} s in: "
              f"{r['failed']}")
        return 1
    print(f"DDP gloo: {args.workers} workers x {r['steps']} steps: {r['seconds']:.1f} s training, "
          f"test accuracy {100 * r['accuracy']:.2f} %, {r['sent'] / 1e9:.2f} GB sent by all workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
