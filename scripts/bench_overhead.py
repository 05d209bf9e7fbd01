#!/usr/bin/env python3
"""Daemon overhead: one node's training rate while its daemon serves three greedy peers,
against the same worker training with no daemon at all; and the bytes one exchange costs.

Per publish density (``--densities``), four setups, all alive for the whole run and measured in
short slices interleaved round by round in a shuffled order (whatever else runs on the machine
hits them alike); the setups not being measured are frozen (SIGSTOP):

* **bare**: the real training worker (``p2pnode.worker.main.run``, spawned as the daemon spawns
  it, publishing as it does) whose pipe a thread of this script drains: no daemon;
* **idle**: a real ``p2pnode start`` (its own worker, no peers of its own), nobody pulling;
* **flood**: the same daemon, three emulated peers pulling ``GET /v1/model?since=V&epoch=E``
  back to back (``benchlib.puller``);
* **paced**: the same peers, each pulling once per bare training step (a real peer with
  ``exchange.every = 1`` training as fast as this node).

Bare and daemon load one frozen config file (this tree's defaults, ``--set``, the density).
With ``--pin`` (default, needs 2 CPUs) the node's processes run on one CPU and the pullers and
this script on the others: "peers on other machines". Every process gets the allocator
settings the daemon gives its worker. Served / bare is the median of per-round ratios.

    .venv/bin/python scripts/bench_overhead.py                       # 7 rounds, 10 % and 1 %
    .venv/bin/python scripts/bench_overhead.py --rounds 1 --window 1 --densities 0.1
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib.overhead import BareWorker, ServedNode, measure, write_config
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section

MODES = ("idle", "flood", "paced")
SECTION = "## Daemon overhead"


def med(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def iqr(values: list[float]) -> str:
    v = sorted(values)
    if len(v) < 4:
        return f"{med(v):.2f}"
    q = statistics.quantiles(v, n=4)
    return f"{q[1]:.2f} ({q[0]:.2f}-{q[2]:.2f})"


def speed_table(results: list[dict[str, Any]]) -> str:
    bare = {(r["density"], r["round"]): r for r in results if r["setup"] == "bare"}

    def eff(r: dict[str, Any]) -> float:
        return r["sps"] / max(r["cpu"]["worker"], 1e-9)

    rows = []
    for density in dict.fromkeys(r["density"] for r in results):
        for setup in ("bare", *MODES):
            rs = [r for r in results if r["setup"] == setup and r["density"] == density]
            if not rs:
                continue
            base = [bare[(density, r["round"])] for r in rs]
            pulls = Counter[str]()
            for r in rs:
                pulls.update(r.get("pulls", {}).get("count", {}))
            n = sum(pulls.values())
            mix = " / ".join(f"{100 * pulls[k] / max(n, 1):.0f} %" for k in ("not_modified", "delta", "merged",
                                                                               "snapshot"))
            rows.append([f"{setup}, {100 * density:g} %", f"{med([r['sps'] for r in rs]):.0f}",
                         iqr([r["sps"] / b["sps"] for r, b in zip(rs, base)]),
                         f"{med([eff(r) / eff(b) for r, b in zip(rs, base)]):.2f}",
                         f"{med([r['cpu']['worker'] for r in rs]):.2f}",
                         f"{med([1e3 * r['cpu']['worker'] * r['seconds'] / max(r['steps'], 1) for r in rs]):.1f}",
                         f"{med([r['faults_per_step'] for r in rs]):.0f}",
                         f"{med([r['cpu'].get('daemon', 0.0) for r in rs]):.2f}",
                         f"{med([r['cpu'].get('pullers', 0.0) for r in rs]):.2f}",
                         f"{med([r['others_cpu'] for r in rs]):.2f}",
                         f"{n / sum(r['seconds'] for r in rs):.0f}" if n else "-", mix if n else "-"])
    return table(["setup", "samples/s", "/ bare (IQR)", "per CPU-second / bare", "worker CPU", "ms CPU/step",
                  "page faults/step", "daemon CPU", "pullers CPU", "others CPU", "requests/s",
                  "304 / delta / merged / snapshot"], rows, "lrrrrrrrrrrl")


def bytes_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for density in dict.fromkeys(r["density"] for r in results):
        pulls = [r for r in results if r["density"] == density and r.get("pulls")]
        count, nbytes = Counter[str](), Counter[str]()
        spans: list[int] = []
        for r in pulls:
            count.update(r["pulls"]["count"])
            nbytes.update(r["pulls"]["bytes"])
            spans += r["pulls"]["spans"]
        dense = next((r["pulls"]["dense"] for r in pulls if r["pulls"]["dense"]), None)
        if not dense:
            continue

        mean = {k: nbytes[k] / count[k] for k in count if count[k]}
        cells = [f"{mean[k]:.0f} ({100 * mean[k] / dense:.2f} %)" if k in mean else "-"
                 for k in ("snapshot", "delta", "merged")]
        span = f" ({statistics.fmean(spans):.1f})" if spans else ""
        rows.append([f"{100 * density:g} %", dense, cells[0], cells[1], cells[2] + span])
    return table(["publish density", "dense fp32", "snapshot", "newest delta (`since = v-1`)",
                  "merged delta (mean versions spanned)"], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window", type=float, default=2.5, help="seconds measured per setup per round")
    ap.add_argument("--densities", default="0.1,0.01", help="publish top-k densities (comma separated)")
    ap.add_argument("--loops", type=int, default=3, help="emulated peers")
    ap.add_argument("--puller-procs", type=int, default=1, help="processes the peers are spread over")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="node on one CPU, pullers and this script on the others (default)")
    ap.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                    help="config for bare and daemon alike (default: training.eval_every=0, "
                         "checkpoint.interval=0, training.data=synthetic when Fashion-MNIST is absent)")
    ap.add_argument("--seed", type=int, default=0, help="of the shuffled slice order")
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    from p2pnode.daemon.supervisor import WORKER_MALLOC_ENV
    from p2pnode.data import DataError, fashion_mnist

    env = {**os.environ, **WORKER_MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    allowed = sorted(os.sched_getaffinity(0))
    node_cpus = peer_cpus = None
    if args.pin and len(allowed) >= 2:
        node_cpus, peer_cpus = {allowed[0]}, set(allowed[1:])
        os.sched_setaffinity(0, peer_cpus)  # this script polls and reads /proc: not the node's CPU
    placement = (f"node on CPU {allowed[0]}, pullers and this script on {sorted(peer_cpus)}" if node_cpus
                 else "unpinned: every process on any CPU")
    sets = args.set or ["training.eval_every=0", "checkpoint.interval=0"]
    if args.set is None:
        try:
            fashion_mnist(False)
        except DataError:
            sets.append("training.data=synthetic")
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    print(f"# {placement}; logs in {work}", flush=True)
    setups: list[tuple[str, float, BareWorker | ServedNode]] = []
    results: list[dict[str, Any]] = []
    try:
        for density in [float(x) for x in args.densities.split(",") if x]:
            config = work / f"node-{density:g}.toml"
            write_config(config, [*sets, f"compression.publish=topk:density={density:g}"])
            bare = BareWorker(config, env, node_cpus)
            bare.pause()
            served = ServedNode(config, work, f"node-{density:g}", env, node_cpus, peer_cpus, args.loops,
                                args.puller_procs)
            served.pause()
            setups += [("bare", density, bare)] + [(mode, density, served) for mode in MODES]
        pace = {}  # paced peers pull once per bare step
        for _, density, target in setups:
            if isinstance(target, BareWorker):
                target.resume()
                pace[density] = 64 / measure(target.edge, {}, target.pid, 2.0)["sps"]
                target.pause()
        rng = random.Random(args.seed)
        for rnd in range(args.rounds):
            order = setups[:]
            rng.shuffle(order)
            for setup, density, target in order:
                target.resume()
                if isinstance(target, BareWorker):
                    r = measure(target.edge, {"worker": [target.pid]}, target.pid, args.window)
                else:
                    cmd = f"paced {pace[density]:.6f}" if setup == "paced" else setup
                    target.pullers.send(cmd)
                    target.pullers.send("mark")
                    roles = {"worker": [target.worker], "daemon": [target.node.pid], "pullers": target.pullers.pids}
                    r = measure(target.edge, roles, target.worker, args.window)
                    if setup != "idle":
                        r["pulls"] = merge_reports(target.pullers.send("report"))
                    target.pullers.send("idle")
                target.pause()
                r.update(setup=setup, density=density, round=rnd)
                results.append(r)
                append_jsonl(args.jsonl, {"bench": "overhead", **r})
            line = ", ".join(f"{r['setup']}@{r['density']:g} {r['sps']:.0f}" for r in results if r["round"] == rnd)
            print(f"round {rnd}: {line} samples/s", flush=True)
    finally:
        for target in dict.fromkeys(t for _, _, t in setups):
            target.close()
    speed, sizes = speed_table(results), bytes_table(results)
    print(f"\n{speed}\n\n{sizes}")
    if args.write:
        write_section(f"{SECTION}\n\nOne node's training rate while its daemon serves {args.loops} peers, against "
                      f"the real worker training with no daemon (`scripts/bench_overhead.py`; its docstring has "
                      f"the method). CPU columns are cores in use during the window.\n\n```\n{command_line()}\n```"
                      f"\n\n- {machine()}\n- {placement}; {args.rounds} rounds of {args.window:g} s slices; "
                      f"config: defaults plus {', '.join(f'`{s}`' for s in sets)}\n\n{speed}\n\n"
                      f"Bytes per answer, and % of the dense fp32 model:\n\n{sizes}\n")
    return 0


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"count": Counter(), "bytes": Counter(), "spans": [], "dense": None}
    for r in reports:
        out["count"].update(r["count"])
        out["bytes"].update(r["bytes"])
        out["spans"] += r["spans"]
        out["dense"] = out["dense"] or r["dense"]
    return out


if __name__ == "__main__":
    sys.exit(main())
