"""Baseline: PyTorch DDP over gloo on loopback, the same small CNN and shards as p2pnode's
cluster benchmark (4 workers x 30 000 Fashion-MNIST samples, batch 64 each, momentum SGD,
cosine schedule, 1 thread per worker; benchlib/ddp.py). Prints training time, test accuracy of
the (identical) final models and the bytes all-reduce moved (all workers' sends).

    .venv/bin/python scripts/bench_ddp.py [--workers 4] [--samples 30000] [--lr 0.2]
    .venv/bin/python scripts/bench_ddp.py --kill-at 230    # the last worker SIGKILLed at step 230
"""

from __future__ import annotations

import argparse
import sys

from benchlib.ddp import DdpRun, run_ddp
from benchlib.results import append_jsonl


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--port", type=int, default=29533, help="rank 0's rendezvous port")
    ap.add_argument("--max-seconds", type=float, default=0.0, help="stop training after this long (0: never)")
    ap.add_argument("--kill-at", type=int, default=0,
                    help="SIGKILL the last worker at this step and report what the others do")
    ap.add_argument("--wait", type=float, default=1800, help="give up on a result after this many seconds")
    ap.add_argument("--jsonl", metavar="FILE", help="append the result to FILE as one JSON line")
    args = ap.parse_args()
    run = DdpRun(workers=args.workers, samples=args.samples, lr=args.lr, port=args.port,
                 max_seconds=args.max_seconds, kill_at=args.kill_at)
    r = run_ddp(run, wait=args.wait)
    append_jsonl(args.jsonl, {"bench": "ddp", **r})
    if "failed" in r:
        print(f"DDP gloo: training failed at step {r['steps']} of {r['of_steps']}, {r.get('seconds', 0):.1f} s in: "
              f"{r['failed']}")
        return 1
    print(f"DDP gloo: {args.workers} workers x {r['steps']} steps: {r['seconds']:.1f} s training, "
          f"test accuracy {100 * r['accuracy']:.2f} %, {r['sent'] / 1e9:.2f} GB sent by all workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
