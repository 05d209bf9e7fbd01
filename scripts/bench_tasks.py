"""Learning quality beyond the built-in CNN: a suite of tasks (benchlib/tasks/suite.py), each
trained by a p2pnode cluster beside its all-reduce reference (one process at the nodes' global
batch for the same steps: what DDP or an all-reduce of gradients computes, bar the batch order)
and a node alone on its shard (node 0's), over several seeds; the classifiers on even shards and
on Dirichlet 0.1 shards. The nodes are started together (training.min_peers = nodes - 1); every
run has the cosine schedule.

    .venv/bin/python scripts/bench_tasks.py --tasks regression charlm imagefolder-bn cnn \\
        --shards even dir0.1 --seeds 0 1 2 3 4 --variants defaults --write

A variant is p2pnode's settings under test (every one printed with the table). Per seed: each
node's final checkpoint evaluated on the task's whole test set (the cluster's figure is its
worst node's), the reference's and the node alone's. Seeds are the outer loop: every task gets a
seed before any gets the next. The goals checked: the mean gap to the reference within 0.5 pt
of accuracy (or 2 % of the reference's distance to a perfect score); no seed below the node
alone; for AdamW tasks, the cluster at least half way from the node alone to the reference on
every seed. ``--report FILE...`` builds the tables from earlier runs' ``--jsonl`` records."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchlib.cluster import train
from benchlib.results import (
    add_output_args,
    append_jsonl,
    command_line,
    machine,
    table,
    write_section,
)
from benchlib.taskref import alone, checkpoint_metrics, reference
from benchlib.tasks.ddpref import ddp_reference
from benchlib.tasks.suite import SHARDS, TASKS, SuiteTask

SECTION = "## The learning-quality suite: each task beside its all-reduce reference (bench_tasks)"
#: what the defaults run, said beside the table
AUTO = ("(nothing set: exchange.sync = \"auto\", the synchronous mode with a cluster secret, gossip "
        "without one)")

VARIANTS: dict[str, list[str]] = {
    # exchange.sync = "auto": the synchronous mode where --secret gives the nodes a cluster
    # secret, gossip without one (p2pnode/config/mode_rule.py)
    "defaults": [],
    "sync": ["--set", "exchange.sync=powersgd"],
    # every tensor whole in int8 blocks (no factoring): the all-reduce's mean but for rounding, to
    # tell PowerSGD's approximation from the rest
    "sync-whole": ["--set", "exchange.sync=powersgd", "--set", "exchange.sync_rank=100000", "--set",
                   "exchange.sync_values=int8"],
    # the same rank in int8 (twice int4's bytes): whether int4's rounding is what AdamW feels
    "sync-i8": ["--set", "exchange.sync=powersgd", "--set", "exchange.sync_values=int8"],
    # int4 pinned: the synchronous mode's values before "auto" gave an adaptive optimizer int8
    "sync-i4": ["--set", "exchange.sync=powersgd", "--set", "exchange.sync_values=int4"],
    "every1": ["--set", "exchange.every=1", "--set", "compression.publish_every=1"],
    "gossip": ["--set", "exchange.sync=none"],
    # gossip as it was for an adaptive optimizer before exchange.adaptive_gossip (one peer's
    # top-10 % copy a round), beside "gossip" (whole copies from 2 peers for AdamW tasks)
    "gossip-sparse": ["--set", "exchange.sync=none", "--set", "exchange.adaptive_gossip=off"],
    "gossip-every2": ["--set", "exchange.sync=none", "--set", "exchange.every=2"],
}


def run_settings(t: SuiteTask, shards: str, seed: int) -> dict[str, Any]:
    """The [training] table every run of ``t`` shares (the cluster's nodes get it as --set)."""
    return {**t.training, "seed": seed, "device": "cpu", "lr_schedule": "cosine", "partition": SHARDS[shards]}


def run_cluster(t: SuiteTask, task: dict[str, Any], shards: str, variant: str, seed: int, nodes: int, samples: int,
                workdir: Path, port: int, secret: str,
                stored: list[float | None] | None = None) -> tuple[list[float], float]:
    """Each node's figure (its final checkpoint on the test set) and the run's wall seconds.
    ``stored``: for a model with BatchNorm, filled with each checkpoint's figure with the
    statistics it holds (the node's own; the suite's figure recomputes them over all the data)."""
    settings = run_settings(t, shards, seed)
    args = [*(a for k, v in settings.items() for a in ("--set", f"training.{k}={v}")),
            *(a for k, v in task.items() for a in ("--set", f"task.{k}={str(v).lower() if isinstance(v, bool) else v}")),
            "--set", f"training.min_peers={nodes - 1}",
            *(["--set", f"node.secret_file={secret}"] if secret else []), *VARIANTS[variant]]

    def evaluate(dirs: list[Path]) -> list[float | None]:
        if stored is not None and t.ddp_anchor:
            stored[:] = [m[t.metric] if m else None
                         for m in checkpoint_metrics(dirs, {**settings, "bn_refresh": 0}, task)]
        return [m[t.metric] if m else None for m in checkpoint_metrics(dirs, settings, task)]

    res = train(f"{t.name}-{shards}-{variant}-{seed}", workdir, nodes, samples, args, port=port, stagger=2.0,
                evaluate=evaluate, timeout=600,
                token=Path(secret).read_bytes().strip().decode() if secret else "")
    return res.accuracies, res.wall_seconds


def measure(a: argparse.Namespace) -> list[dict[str, Any]]:
    from p2pnode.data import default_cache_dir

    records: list[dict[str, Any]] = []
    for seed in a.seeds:
        for name in a.tasks:
            t = TASKS[name]
            task = {**t.task, **t.prepare(default_cache_dir())}
            samples = a.samples or t.samples
            shards = [s for s in a.shards if t.classifier or s == "even"] or ["even"]
            started = time.monotonic()
            ref = reference(run_settings(t, "even", seed), task, a.nodes, samples)[t.metric]
            ref_s = time.monotonic() - started
            for sh in shards:
                started = time.monotonic()
                own = alone(run_settings(t, sh, seed), task, a.nodes, samples)[t.metric]
                own_s = time.monotonic() - started
                anchor: dict[str, Any] = {}
                if t.ddp_anchor and not a.no_ddp:
                    started = time.monotonic()
                    anchor = {"ddp": ddp_reference(run_settings(t, sh, seed), task, a.nodes, samples)[t.metric],
                              "ddp_s": time.monotonic() - started}
                for v in a.variants:
                    stored: list[float | None] = []
                    try:
                        got, wall = run_cluster(t, task, sh, v, seed, a.nodes, samples, Path(a.workdir), a.port,
                                                a.secret, stored)
                    except RuntimeError as exc:  # a node that exited: the run counts as failed, the others go on
                        print(f"{name} {sh} {v} seed {seed}: {str(exc)[:300]}", file=sys.stderr)
                        got, wall = [], 0.0
                    rec = {"bench": "tasks", "task": name, "shards": sh, "variant": v, "seed": seed,
                           "metric": t.metric, "nodes_values": got, "reference": ref, "alone": own,
                           "nodes": a.nodes, "samples": samples, "secret": bool(a.secret), "cluster_s": wall,
                           "reference_s": ref_s, "alone_s": own_s, **anchor,
                           **({"nodes_stored": stored} if stored else {})}
                    records.append(rec)
                    append_jsonl(a.jsonl, rec)
                    print(json.dumps(rec), flush=True)
    return records


def fmt(t: SuiteTask, x: float) -> str:
    if t.metric == "accuracy":
        return f"{100 * x:.2f} %"
    return f"{x:.2f}" if t.metric == "perplexity" else f"{x:.4f}"


def fmt_gap(t: SuiteTask, x: float) -> str:
    return f"{100 * x:+.2f} pt" if t.metric == "accuracy" else (f"{x:+.2f}" if t.metric == "perplexity"
                                                                else f"{x:+.4f}")


def report(records: list[dict[str, Any]]) -> tuple[str, str]:
    """The per-seed table and the summary table (one row a task, shards and variant)."""
    rows, summary = [], []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["task"], r["shards"], r["variant"]), []).append(r)
    for (name, sh, v), recs in groups.items():
        t = TASKS[name]
        gaps, halves, above, refs = [], 0, 0, []
        for r in sorted(recs, key=lambda r: r["seed"]):
            if not r["nodes_values"]:
                rows.append([name, sh, v, r["seed"], "failed", fmt(t, r["reference"]), fmt(t, r["alone"]),
                             "", "", ""])
                continue
            worst = t.worst(r["nodes_values"])
            gap = t.gain(worst, r["reference"])
            half = t.gain(worst, r["alone"]) >= 0.5 * t.gain(r["reference"], r["alone"])
            gaps.append(gap)
            refs.append(r["reference"])
            halves += half
            above += t.gain(worst, r["alone"]) >= 0
            rows.append([name, sh, v, r["seed"], " / ".join(fmt(t, x) for x in r["nodes_values"]),
                         fmt(t, r["reference"]), fmt(t, r["alone"]), fmt_gap(t, gap),
                         ("yes" if half else "no") if t.adamw else "(SGD)", f"{r['cluster_s']:.0f}"])
        if not gaps:
            continue
        mean = statistics.mean(gaps)
        allowed = t.allowed(statistics.mean(refs))
        n = len(gaps)
        summary.append([name, sh, v, t.metric, n, fmt_gap(t, mean), f"{fmt_gap(t, min(gaps))} to {fmt_gap(t, max(gaps))}",
                        fmt_gap(t, statistics.stdev(gaps)).lstrip("+") if n > 1 else "",
                        fmt_gap(t, -allowed), "yes" if mean >= -allowed else "no", f"{above} of {n}",
                        f"{halves} of {n}" if t.adamw else "(SGD)"])
    per_seed = table(["task", "shards", "variant", "seed", "each node", "reference", "node alone",
                      "gap (worst node - reference, + better)", "half way from alone (AdamW)", "cluster s"], rows,
                     "lllrrrrrrr")
    goals = table(["task", "shards", "variant", "metric", "seeds", "mean gap", "range", "sd", "goal: mean gap at least",
                   "mean gap meets it", "seeds not below alone", "seeds half way from alone (AdamW)"], summary,
                  "llllrrrrrlrr")
    return per_seed, goals


def anchors(records: list[dict[str, Any]]) -> str:
    """Tasks with BatchNorm: each seed beside both anchors (the one process at the global batch,
    and DDP's arithmetic on the nodes' shards, whose ranks each normalise their own batch), and
    the checkpoints as the nodes hold them (the BatchNorm statistics they ended with); one summary row a
    task, shards and variant. Empty when no record has the second anchor."""
    rows, summary = [], []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if "ddp" in r and r["nodes_values"]:
            groups.setdefault((r["task"], r["shards"], r["variant"]), []).append(r)
    for (name, sh, v), recs in groups.items():
        t = TASKS[name]
        to_ref, to_ddp, ddp_ref = [], [], []
        for r in sorted(recs, key=lambda r: r["seed"]):
            worst = t.worst(r["nodes_values"])
            held = [x for x in r.get("nodes_stored", []) if x is not None]
            to_ref.append(t.gain(worst, r["reference"]))
            to_ddp.append(t.gain(worst, r["ddp"]))
            ddp_ref.append(t.gain(r["ddp"], r["reference"]))
            rows.append([name, sh, v, r["seed"], fmt(t, worst), " / ".join(fmt(t, x) for x in held),
                         fmt(t, r["reference"]), fmt(t, r["ddp"]), fmt(t, r["alone"]), fmt_gap(t, to_ref[-1]),
                         fmt_gap(t, to_ddp[-1]), fmt_gap(t, ddp_ref[-1])])
        n = len(to_ref)

        def spread(xs: list[float]) -> str:
            return f"{fmt_gap(t, statistics.mean(xs))} ({fmt_gap(t, min(xs))} to {fmt_gap(t, max(xs))})"
        summary.append([name, sh, v, n, spread(to_ref), spread(to_ddp), spread(ddp_ref)])
    if not rows:
        return ""
    per_seed = table(["task", "shards", "variant", "seed", "worst node (statistics over all the data)",
                      "each node's checkpoint as it is (the statistics it holds)", "reference (one process, 3x batch)",
                      "DDP on the same shards", "node alone", "gap to the reference", "gap to DDP",
                      "DDP's gap to the reference"], rows, "lllrrrrrrrrr")
    means = table(["task", "shards", "variant", "seeds", "mean gap to the reference (range)",
                   "mean gap to DDP (range)", "DDP's mean gap to the reference (range)"], summary, "lllrrrr")
    return per_seed + "\n\n" + means


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--shards", nargs="+", default=list(SHARDS), choices=list(SHARDS),
                    help="the classifiers' partitions (the other tasks: even only)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--variants", nargs="+", default=["defaults"], choices=sorted(VARIANTS))
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--samples", type=int, default=0, help="training samples a node (0: each task's own size)")
    ap.add_argument("--port", type=int, default=17400)
    ap.add_argument("--secret", default="", help="a cluster secret file every node reads (node.secret_file)")
    ap.add_argument("--workdir", default="/tmp/p2pnode-bench-tasks")
    ap.add_argument("--no-ddp", action="store_true",
                    help="skip the second anchor of tasks with BatchNorm (DDP's arithmetic on the same shards)")
    ap.add_argument("--report", nargs="+", metavar="JSONL", help="no runs: the tables of these files' records")
    add_output_args(ap, SECTION)
    a = ap.parse_args()
    if a.report:
        records = [json.loads(line) for f in a.report for line in Path(f).read_text().splitlines() if line.strip()]
        records = [r for r in records if r.get("bench") == "tasks" and "task" in r]
    else:
        records = measure(a)
    per_seed, goals = report(records)
    used: dict[str, set[int]] = {}
    for r in records:
        used.setdefault(r["task"], set()).add(r["samples"])
    text = "\n".join([
        SECTION, "",
        f"Command: `{command_line()}`", "",
        machine(), "",
        "Tasks (benchlib/tasks/suite.py; samples a node, the reference nodes x that at nodes x the batch):", "",
        *(f"- `{n}`: {TASKS[n].what}; {' or '.join(str(x) for x in sorted(used[n]))} samples a node; "
          f"metric {TASKS[n].metric}" for n in TASKS if n in used), "",
        "Variants: " + "; ".join(f"`{v}`: {' '.join(VARIANTS[v]) or AUTO}"
                                 for v in sorted({r['variant'] for r in records})) +
        ("; every node given a cluster secret (node.secret_file)" if any(r.get("secret") for r in records) else ""),
        "", per_seed, "", goals, "", *([second, ""] if (second := anchors(records)) else [])])
    print(text)
    if a.write:
        write_section(text)
    sys.exit(0)


if __name__ == "__main__":
    main()
