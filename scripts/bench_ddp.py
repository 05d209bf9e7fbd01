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
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from p2pnode.daemon.trainer import WORKER_MALLOC_ENV  # noqa: E402
from p2pnode.data import fashion_mnist, shard  # noqa: E402
from p2pnode.models import build_model  # noqa: E402


def worker(rank: int, world: int, samples: int, lr: float, master: str, out: mp.Queue | None,
           max_seconds: float = 0.0) -> dict[str, float] | None:
    """One DDP worker; rank 0 returns (and puts on ``out``) what it measured.

    ``max_seconds`` > 0 stops every worker after that much training (all ranks agree through an
    all-reduce of the flag every 10 steps), for links so thin a full run would take too long;
    the result then says how many steps were done and the accuracy is left out."""
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
    order, pos = torch.randperm(len(train), generator=gen), 0
    done = steps
    for step in range(steps):
        if max_seconds > 0 and step % 10 == 0 and step:
            flag = torch.tensor([float(time.monotonic() - start > max_seconds)])
            dist.all_reduce(flag)
            if flag.item() > 0:
                done = step
                break
        if pos + 64 > len(order):
            order, pos = torch.randperm(len(train), generator=gen), 0
        idx = order[pos:pos + 64]
        pos += 64
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        opt.zero_grad()
        F.cross_entropy(model(train.images[idx]), train.labels[idx]).backward()
        opt.step()
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
    args = ap.parse_args()
    os.environ.update(WORKER_MALLOC_ENV)  # the same allocator settings p2pnode's workers get
    if args.rank >= 0:
        result = worker(args.rank, args.workers, args.samples, args.lr, args.master, None, args.max_seconds)
        if result is not None:
            print(json.dumps(result), flush=True)
        return 0
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.workers, args.samples, args.lr, args.master, out,
                                              args.max_seconds))
             for r in range(args.workers)]
    for p in procs:
        p.start()
    r = out.get(timeout=1800)
    for p in procs:
        p.join()
    print(f"DDP gloo: {args.workers} workers x {r['steps']} steps: {r['seconds']:.1f} s training, "
          f"test accuracy {100 * r['accuracy']:.2f} %, {r['sent'] / 1e9:.2f} GB sent by all workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
