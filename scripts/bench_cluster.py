"""Whole-cluster benchmark: a local cluster of real `p2pnode start` processes on Fashion-MNIST,
one configuration after another, each node on its own shard, until every node has trained on
--samples samples. Reports, per configuration, each node's final test accuracy (its checkpoint
on all 10 000 test images), training time (first step to done, start-up excluded), and the model
bytes moved in the whole cluster; writes the table to docs/BENCHMARKS.md ("Cluster training").

    .venv/bin/python scripts/bench_cluster.py                      # the default variants
    .venv/bin/python scripts/bench_cluster.py --variants tuned paper

Variant "kill" SIGKILLs the last node when the others are half way, to show the rest go on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from demo_watch import fetch as status  # noqa: E402
from p2pnode.config import Config  # noqa: E402
from p2pnode.worker.training import ShardTrainer  # noqa: E402

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


def loopback(i: int) -> tuple[list[str], str]:
    """Where node i runs: no command prefix, on loopback."""
    return [], "127.0.0.1"


def run_variant(name: str, args: list[str], nodes: int, samples: int, port: int, workdir: Path,
                timeout: float, place: Callable[[int], tuple[list[str], str]] = loopback) -> dict[str, Any]:
    """``place(i)`` gives node i's command prefix and host (scripts/bench_thin.py puts each node
    in its own network namespace); node i listens on port + i of its host."""
    run = workdir / name
    subprocess.run(["rm", "-rf", str(run)], check=True)
    run.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    procs, addrs = [], []
    for i in range(nodes):
        prefix, host = place(i)
        addr = f"{host}:{port + i}"
        cmd = [*prefix, sys.executable, "-m", "p2pnode", "start", "--listen", addr,
               "--state-dir", str(run / f"node{i}"),
               "--data", "fashion-mnist", "--shard", f"{i}/{nodes}",
               "--set", f"training.max_samples={samples}", "--set", "training.lr_schedule=cosine",
               "--set", "training.eval_every=0", *args]
        if i:
            cmd += ["--seed", addrs[0]]
        with open(run / f"node{i}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        addrs.append(addr)
    last: dict[str, dict[str, Any]] = {}
    killed = None
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            for a in addrs:
                if a != killed and (s := status(a)):
                    last[a] = s
            live = [a for a in addrs if a != killed]
            if name == "kill" and killed is None and all(
                    a in last and last[a]["training"]["samples"] >= samples // 2 for a in addrs[:-1]):
                procs[-1].send_signal(signal.SIGKILL)
                killed = addrs[-1]
            if all(a in last and last[a]["training"]["done"] for a in live):
                break
            time.sleep(1.0)
    finally:
        for i, p in enumerate(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    trainer = ShardTrainer(Config())
    rows = []
    for i, a in enumerate(addrs):
        if a == killed:
            continue
        s = last.get(a, {})
        acc = trainer.checkpoint_accuracy(run / f"node{i}")
        t = s.get("training", {})
        rows.append({"node": i, "accuracy": acc, "train_seconds": t.get("train_seconds"),
                     "samples": t.get("samples"), "received": s.get("bytes", {}).get("model_received", 0),
                     "exchanges": s.get("exchanges", {}).get("done", 0),
                     "skipped": s.get("exchanges", {}).get("skipped", 0)})
    accs = [r["accuracy"] for r in rows if r["accuracy"] is not None]
    secs = [r["train_seconds"] for r in rows if r["train_seconds"] is not None]
    return {"variant": name, "rows": rows, "min_acc": min(accs) if accs else None,
            "median_acc": statistics.median(accs) if accs else None,
            "max_train_s": max(secs) if secs else None,
            "bytes": sum(r["received"] for r in rows), "killed": killed is not None}


def table(results: list[dict[str, Any]]) -> str:
    out = ["| variant | what | nodes done | test accuracy min / median | training time (slowest node) | "
           "model bytes moved | exchanges (skipped) per node, median |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ex = statistics.median([x["exchanges"] for x in r["rows"]]) if r["rows"] else 0
        sk = statistics.median([x["skipped"] for x in r["rows"]]) if r["rows"] else 0
        acc = (f"{100 * r['min_acc']:.2f} % / {100 * r['median_acc']:.2f} %" if r["min_acc"] is not None else "-")
        secs = f"{r['max_train_s']:.0f} s" if r["max_train_s"] else "-"
        out.append(f"| {r['variant']} | {VARIANTS[r['variant']][0]} | {len(r['rows'])} | {acc} | {secs} | "
                   f"{r['bytes'] / 1e6:.0f} MB | {ex:.0f} ({sk:.0f}) |")
    return "\n".join(out)


def write_section(text: str, head: str = "## Cluster training") -> None:
    """Replace the section of docs/BENCHMARKS.md whose heading starts with ``head`` (or append it)."""
    path = ROOT / "docs" / "BENCHMARKS.md"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    start = doc.find(head)
    if start >= 0:
        end = doc.find("\n## ", start + len(head))
        doc = doc[:start] + text.rstrip() + "\n" + (doc[end:] if end >= 0 else "")
    else:
        doc = doc.rstrip() + "\n\n" + text.rstrip() + "\n"
    path.write_text(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=["defaults", "paper"], choices=list(VARIANTS))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000, help="training samples per node")
    ap.add_argument("--port", type=int, default=7571)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_cluster"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    results = []
    for v in args.variants:
        print(f"== {v}: {VARIANTS[v][0]}", flush=True)
        r = run_variant(v, VARIANTS[v][1], args.nodes, args.samples, args.port, Path(args.workdir), args.timeout)
        print(json.dumps(r["rows"]), flush=True)
        results.append(r)
    text = table(results)
    print(text)
    load_avg = os.getloadavg()[0]
    section = (f"## Cluster training\n\n{args.nodes} real `p2pnode start` processes on loopback, small CNN, "
               f"Fashion-MNIST, each node on its own 1/{args.nodes} shard until it has trained on "
               f"{args.samples} samples (cosine learning rate), one variant after another. Accuracy: each "
               f"node's final checkpoint on all 10 000 test images. Training time: first step to done, "
               f"start-up excluded. Bytes: model payloads received by all nodes.\n\n"
               f"```\n.venv/bin/python scripts/bench_cluster.py --variants {' '.join(args.variants)}\n```\n\n"
               f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} CPUs, "
               f"{platform.processor() or platform.machine()}, load average {load_avg:.1f} at the end "
               f"(a shared machine: times are indicative)\n\n{text}\n")
    if not args.no_write:
        write_section(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
