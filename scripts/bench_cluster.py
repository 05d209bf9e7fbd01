"""Whole-cluster benchmark: a local cluster of real `p2pnode start` processes on Fashion-MNIST,
one configuration after another, each node on its own shard, until every node has trained on
--samples samples (benchlib.cluster.train). Reports, per configuration, each node's final test
accuracy (its checkpoint on all 10 000 test images), training time (first step to done,
start-up excluded), and the model bytes moved in the whole cluster; with --write, replaces the
"Cluster training" section of docs/BENCHMARKS.md.

    .venv/bin/python scripts/bench_cluster.py                      # the default variants
    .venv/bin/python scripts/bench_cluster.py --variants ring paper --jsonl run/cluster.jsonl

Variant "kill" SIGKILLs the last node when the others are half way, to show the rest go on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchlib.cluster import ROOT, TrainResult, train
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section

PAPER = ["--set", "exchange.every=1", "--set", "compression.publish_every=1",
         "--set", "compression.publish=topk:density=0.01", "--set", "compression.gradient=mean-threshold",
         "--set", "training.lr=0.05", "--set", "exchange.peer_selection=random"]
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "defaults": ("the shipped defaults (conf/node.toml)", []),
    "paper": ("Algorithm 1 as in the paper: exchange and publish every step, top-1 %, mean-threshold "
              "gradient mask, lr 0.05", PAPER),
    "random": ("defaults but random peer selection (the paper's)", ["--set", "exchange.peer_selection=random"]),
    "ring": ("defaults but ring peer selection", ["--set", "exchange.peer_selection=ring"]),
    "every2": ("defaults but exchange and publish every 2 steps",
               ["--set", "exchange.every=2", "--set", "compression.publish_every=2"]),
    "mean-threshold": ("defaults with the paper's gradient mask", ["--set", "compression.gradient=mean-threshold"]),
    "alone": ("no exchange at all (each node alone on its shard)", ["--set", "exchange.every=1000000"]),
    "kill": ("defaults, last node SIGKILLed half way", []),
    "lr0.15": ("defaults but lr 0.15", ["--set", "training.lr=0.15"]),
    "lr0.3": ("defaults but lr 0.3", ["--set", "training.lr=0.3"]),
    "top20": ("defaults but publish top-20 %", ["--set", "compression.publish=topk:density=0.2"]),
    "contribution": ("defaults but loss-weighted averaging", ["--set", "exchange.averaging=contribution"]),
}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def result_table(results: list[TrainResult]) -> str:
    rows = [[r.name, VARIANTS[r.name][0], len(r.rows), f"{pct(r.min_acc)} / {pct(r.median_acc)}",
             f"{r.max_train_s:.0f} s" if r.max_train_s else "-", f"{r.bytes_received / 1e6:.0f} MB",
             f"{r.median('exchanges'):.0f} ({r.median('skipped'):.0f})"] for r in results]
    return table(["variant", "what", "nodes done", "test accuracy min / median", "training time (slowest node)",
                  "model bytes moved", "exchanges (skipped) per node, median"], rows, "llrrrrr")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["defaults", "paper"], choices=list(VARIANTS))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000, help="training samples per node")
    ap.add_argument("--port", type=int, default=7571)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_cluster"))
    add_output_args(ap, "## Cluster training")
    args = ap.parse_args()
    results = []
    for v in args.variants:
        print(f"== {v}: {VARIANTS[v][0]}", flush=True)
        r = train(v, Path(args.workdir), args.nodes, args.samples, VARIANTS[v][1], args.port, args.timeout,
                  kill_last_at=0.5 if v == "kill" else 0.0)
        print(json.dumps(r.to_json()["rows"]), flush=True)
        append_jsonl(args.jsonl, {"bench": "cluster", **r.to_json()})
        results.append(r)
    text = result_table(results)
    print(text)
    if args.write:
        write_section(f"## Cluster training\n\n{args.nodes} real `p2pnode start` processes on loopback, small CNN, "
                      f"Fashion-MNIST, each node on its own 1/{args.nodes} shard until it has trained on "
                      f"{args.samples} samples (cosine learning rate), one variant after another. Accuracy: each "
                      f"node's final checkpoint on all 10 000 test images. Training time: first step to done, "
                      f"start-up excluded. Bytes: model payloads received by all nodes.\n\n"
                      f"```\n{command_line()}\n```\n\n- {machine()} (a shared machine: times are indicative)"
                      f"\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
