"""The GPT-2-small-shaped example (examples/gpt2, 110M parameters) trained by 4 nodes, gossip
and the synchronous mode, beside one process taking the same steps at the same global batch.

Every run starts from the same initial model (training.seed) and trains ``--steps`` steps of
AdamW (the task's optimizer hook) at a constant ``--lr``, no warm-up, on windows of
``--context`` tokens: the nodes at batch 1 each, the single process at batch ``--nodes`` (the
same global batch), through p2pnode's own trainer (``ShardTrainer``: the worker's step, clipping
and evaluation). The held-out loss is measured on the same ``task.test_windows`` windows at the
start (the shared initial model) and at the end (each node's final model). Bytes: what the
nodes' daemons received (model payloads, or the synchronous mode's means), all nodes together.
Memory: peak RSS of each node (daemon + worker) and of the single process.

    nice -n 5 .venv/bin/python scripts/bench_gpt2.py [--steps 12] [--write]

On a 2-core machine a step of this model takes seconds: this shows the real thing running end
to end, not convergence.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.cluster import ROOT, Cluster  # noqa: E402
from benchlib.nodeprobe import mem_available, peak_rss  # noqa: E402
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section  # noqa: E402
from benchlib.status import wait_for  # noqa: E402

SECTION = "## A GPT-2-small-shaped model on four nodes"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"training.task": "gpt2", "task.context": args.context, "task.text_mb": args.text_mb,
            "task.test_windows": args.test_windows, "training.lr": args.lr, "training.warmup_samples": 0,
            "training.eval_every": 0, "training.seed": 0, "checkpoint.interval": 0}


def single(args: argparse.Namespace) -> dict[str, Any]:
    """One process, ``nodes`` x batch 1 as one batch, the same steps."""
    import resource

    import torch

    from p2pnode.config import Config
    from p2pnode.worker.training import ShardTrainer

    torch.set_num_threads(1)
    data: dict[str, Any] = {"training": {"batch_size": args.nodes, "max_samples": args.steps * args.nodes},
                            "task": {}}
    for key, value in settings(args).items():
        table_name, name = key.split(".", 1)
        data.setdefault(table_name, {})[name] = value
    trainer = ShardTrainer(Config.from_dict(data))
    _, start, _ = trainer.evaluate(0)
    began = time.monotonic()
    while not trainer.done:
        trainer.train_step()
    seconds = time.monotonic() - began
    _, end, _ = trainer.evaluate(0)
    return {"start": start, "end": [end], "step_s": seconds / max(1, trainer.step), "steps": trainer.step,
            "bytes": 0, "peak_rss": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]}


def cluster_run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    root = Path(args.workdir) / mode
    shutil.rmtree(root, ignore_errors=True)
    extra = {**settings(args), "training.batch_size": 1, "training.max_samples": args.steps,
             "training.min_peers": args.nodes - 1, "membership.bootstrap_from_peer": "false",
             "exchange.max_replicas": 2}
    if mode == "sync":
        extra.update({"exchange.sync": "powersgd"})
    else:
        extra.update({"exchange.every": 2})
    flat = [a for k, v in extra.items() for a in ("--set", f"{k}={v}")]
    out: dict[str, Any] = {"mode": mode}
    with Cluster(root, args.nodes, lambda i: ["--shard", f"{i}/{args.nodes}", *flat], port=args.port) as c:
        began = time.monotonic()
        peaks: list[dict[str, int]] = [{} for _ in c.nodes]

        def finished() -> bool:
            for i, node in enumerate(c.nodes):
                for k, v in peak_rss(node.pid).items():
                    peaks[i][k] = max(peaks[i].get(k, 0), v)
            if mem_available() < args.min_free_gb * 1e9:
                raise MemoryError("the machine's available memory fell below the floor")
            ss = c.statuses()
            return all(s and s["training"]["done"] and s["training"]["test_loss"] is not None for s in ss)

        try:
            wait_for(finished, args.timeout, "every node trained and evaluated", interval=2.0)
        except (AssertionError, MemoryError) as exc:
            out["failed"] = str(exc)[:300]
        ss = c.statuses()
        out["wall_s"] = time.monotonic() - began
        out["end"] = [s["training"]["test_loss"] if s else None for s in ss]
        out["steps"] = [s["training"]["step"] if s else None for s in ss]
        secs = [s["training"]["train_seconds"] / max(1, s["training"]["step"]) for s in ss
                if s and s["training"]["train_seconds"]]
        out["step_s"] = statistics.median(secs) if secs else None
        out["bytes"] = sum((s["bytes"]["model_received"] + s["bytes"].get("sync_received", 0)) for s in ss if s)
        out["exchanges"] = [s["exchanges"]["done"] if s else None for s in ss]
        out["peak_rss"] = [sum(p.values()) for p in peaks]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4, help="nodes (the single process's batch: as many)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--text-mb", type=float, default=1.0)
    ap.add_argument("--test-windows", type=int, default=16)
    ap.add_argument("--modes", nargs="+", default=["single", "gossip", "sync"])
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--min-free-gb", type=float, default=1.5)
    ap.add_argument("--port", type=int, default=7851)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_gpt2"))
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    results: dict[str, dict[str, Any]] = {}
    if "single" in args.modes:
        print("== one process", flush=True)
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # its memory goes back before the nodes start
            results["single"] = pool.apply(single, (args,))
        print(json.dumps(results["single"]), flush=True)
    start = results["single"]["start"] if "single" in results else None
    for mode in [m for m in args.modes if m != "single"]:
        print(f"== {args.nodes} nodes, {mode}", flush=True)
        results[mode] = cluster_run(args, mode)
        print(json.dumps(results[mode]), flush=True)
        append_jsonl(args.jsonl, {"bench": "gpt2", **results[mode]})
    rows = []
    names = {"single": f"one process, batch {args.nodes}", "gossip": f"{args.nodes} nodes, gossip (defaults, "
             "exchange every 2 steps)", "sync": f"{args.nodes} nodes, synchronous (PowerSGD rank 24, "
             "int8: exchange.sync_values \"auto\" for AdamW)"}
    for mode, r in results.items():
        ends = [e for e in r.get("end", []) if e is not None]
        steps = r["steps"] if isinstance(r["steps"], int) else (min(x for x in r["steps"] if x is not None)
                                                                if any(x is not None for x in r["steps"]) else 0)
        rows.append([names.get(mode, mode), str(steps), f"{start:.3f}" if start is not None else "-",
                     " / ".join(f"{e:.3f}" for e in ends) or r.get("failed", "-"),
                     f"{r['step_s']:.1f} s" if r.get("step_s") else "-",
                     f"{r['bytes'] / 1e6:.0f} MB" if r.get("bytes") else "0",
                     f"{max(r['peak_rss']) / 1e9:.2f} GB" if r.get("peak_rss") else "-"])
    text = table(["run", "steps (each node)", "held-out loss at start", "held-out loss at end (each node)",
                  "seconds a step", "bytes received (all nodes)", "peak RSS (per node: daemon + worker)"], rows)
    print(text)
    if args.write:
        write_section(f"{SECTION}\n\nexamples/gpt2 (110M parameters, 441 MB float32), AdamW at lr {args.lr}, "
                      f"{args.context}-token windows, {args.steps} steps, global batch {args.nodes}; the held-out "
                      f"loss on {args.test_windows} windows. Nodes on loopback, started together "
                      f"(training.min_peers), no bootstrap from a peer (all start from the seeded model).\n\n"
                      f"```\nnice -n 5 {command_line()}\n```\n\n- {machine()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
