"""DDP's all-reduce of a model's worth of float32 over gloo, timed per round: the anchor the
exchange path of a model that size is compared with (one round is what DDP moves each step).

``run_allreduce(numel, workers, rounds, place)`` starts one ``python -m benchlib.allreduce_anchor``
per rank (with ``place(rank)``'s command prefix: loopback or a network namespace) and returns
rank 0's per-round seconds. The tensor is all-reduced in place, as DDP's buckets are (no
bucketing: one tensor, gloo's ring); the first round is a warm-up and is reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from benchlib.cluster import ROOT, Place
from benchlib.procs import stop


def rank_main(rank: int, world: int, master: str, port: int, numel: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    x = torch.ones(numel, dtype=torch.float32)
    seconds = []
    for _ in range(rounds + 1):
        dist.barrier()
        began = time.monotonic()
        dist.all_reduce(x)
        seconds.append(time.monotonic() - began)
    dist.destroy_process_group()
    return {"warmup_s": seconds[0], "seconds": seconds[1:], "numel": numel, "world": world}


def run_allreduce(numel: int, workers: int, rounds: int, place: Place, port: int = 29611,
                  timeout: float = 900.0, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Rank 0's result, or ``{"failed": why}``."""
    master = place(0)[1]
    procs = []
    for rank in range(workers):
        prefix, _ = place(rank)
        cmd = [*prefix, sys.executable, "-m", "benchlib.allreduce_anchor", "--rank", str(rank), "--world",
               str(workers), "--master", master, "--port", str(port), "--numel", str(numel), "--rounds", str(rounds)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}))
    try:
        out, err = procs[0].communicate(timeout=timeout)
        for p in procs[1:]:
            p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:.0f} s"}
    finally:
        for p in procs:
            if p.poll() is None:
                stop(p, 5.0)  # type: ignore[arg-type]
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if procs[0].returncode != 0 or not lines:
        return {"failed": (err.strip().splitlines() or ["no output"])[-1][:300]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--numel", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    result = rank_main(a.rank, a.world, a.master, a.port, a.numel, a.rounds)
    if a.rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
