"""Baseline: PyTorch DDP over gloo on loopback, the same small CNN and shards as p2pnode's
cluster benchmark (4 workers x 30 000 Fashion-MNIST samples, batch 64 each, momentum SGD,
cosine schedule, 1 thread per worker). Prints training time, test accuracy of the (identical)
final models and the bytes all-reduce moved (ring all-reduce: each worker sends
2 (n - 1) / n of the gradient bytes per step; we count what all workers send).

    .venv/bin/python scripts/bench_ddp.py [--workers 4] [--samples 30000] [--lr 0.2]
"""

from __future__ import annotations

import argparse
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


def worker(rank: int, world: int, samples: int, lr: float, port: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
    for step in range(steps):
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
    if rank == 0:
        test = fashion_mnist(False)
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(test.images[i:i + 1000]).argmax(1) == test.labels[i:i + 1000]).sum())
                          for i in range(0, len(test), 1000))
        sent = world * steps * grad_bytes * 2 * (world - 1) / world
        out.put((elapsed, correct / len(test), sent, steps))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args()
    os.environ.update(WORKER_MALLOC_ENV)  # the same allocator settings p2pnode's workers get
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.workers, args.samples, args.lr, args.port, out))
             for r in range(args.workers)]
    for p in procs:
        p.start()
    elapsed, acc, sent, steps = out.get(timeout=1800)
    for p in procs:
        p.join()
    print(f"DDP gloo: {args.workers} workers x {steps} steps: {elapsed:.1f} s training, "
          f"test accuracy {100 * acc:.2f} %, {sent / 1e9:.2f} GB sent by all workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
