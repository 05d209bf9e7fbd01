#!/usr/bin/env python3
"""The paper's evaluation (Cui 2019, Section IV) as one command: a single process, an asynchronous
parameter server (p2pnode's ``node.role = ps``), PyTorch DDP (gloo), hivemind, and p2pnode as
in the paper and with its defaults, on the same model (the small CNN), data (Fashion-MNIST,
one shard per worker), batch size (64) and samples per worker, under three networks:

* ``loopback``: every process on 127.0.0.1, no limit. Every system runs; the single process
  runs only here (it has no network: its run stands for every condition);
* ``300mbit``: the paper's setup: every machine in its own network namespace, only the
  parameter server's link capped both ways at 300 Mbit/s (``tc tbf``, benchlib.netns), its
  workers' links uncapped; every push and pull crosses the server's link, so it is the
  bottleneck, as in the paper. The decentralised systems have no server, so nothing of theirs is
  capped here: their loopback runs stand for them (the report says so on every such row). Both
  parameter servers run: server momentum 0.6 (the experiment's) and 0.9;
* ``ratio``: every machine's link capped both ways at the rate that gives this CNN the paper's
  ratio of dense transfer time to compute per batch (benchlib/ratio.py: the arithmetic is
  written to the log and the report; the measurement of the first full run is reused unless
  ``--measure-ratio``). Every system but the single process runs.

The parameter server's momentum is 0.6: asynchronous SGD with M pushers adds an implicit
momentum of about 1 - 1/M (Mitliagkas et al. 2016), 0.75 for 4, and with 0.9 on top the first
full run's server diverged at the ratio cap (10 % test accuracy) and ended at 84.4 % at
300 Mbit/s, while 0.6 ((1 - 0.6)(1 - 0.75) = 1 - 0.9) reached 87.6 % and 87.3 %.

Every node's progress is polled twice a second (step, loss, periodic test accuracy) and each
run ends with its final models evaluated on the 10 000 test images and on 5 000 training
images (a parameter server: its server's model). Everything goes to one JSON-lines log
(``--jsonl``), with the load average at each run's start and end; ``--report`` then writes
docs/EXPERIMENTS.md with the paper's tables side by side and the figures
(``scripts/experiment_report.py``).

    sudo bash scripts/experiment.sh                       # from a fresh clone: .venv, the bench extra, the full run
    sudo .venv/bin/python scripts/experiment.py --quick   # ratio only, 4 000 samples: 7 minutes at load 3.5-5.4
    sudo .venv/bin/python scripts/experiment.py           # the full run: 13 runs, 20 000 samples per worker

The full run (no flags) writes its log to docs/experiments/full.jsonl and then docs/EXPERIMENTS.md
with its figures; on this 2-core machine, shared, it took 30.4 minutes at load average 0.1-4.3
(2026-11-24) and 43.8 at 3.9-10.1 (2026-11-25, the committed report; the report says how long,
with the load averages). 20 000 samples per worker, not the 30 000 of the first full run, to fit that:
p2pnode still reaches 85 % early and ends within 1 pt of the single process for the same samples.

Needs root for the namespaces (without it, only ``--conditions loopback`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.cluster import ROOT, Cluster, Place, finished, loopback, training_args
from benchlib.ddp import FIXED as BASELINE_FIXED, DdpRun, run_ddp
from benchlib.hivemind_run import HivemindRun, run_hivemind
from benchlib.hivemind_run import unavailable as hivemind_unavailable
from benchlib.netns import Topology, link_bytes, unavailable
from benchlib.ratio import MEASURED, measure
from benchlib.results import append_jsonl, command_line, machine
from benchlib.steplog import evaluate_checkpoints

NODES = 4
#: the full run's log (``scripts/experiment.py`` with no flags writes it, then docs/EXPERIMENTS.md)
FULL_LOG = ROOT / "docs" / "experiments" / "full.jsonl"
#: training images each final model is evaluated on (Table II)
TRAIN_IMAGES = 5000
SYSTEMS = ("single", "ps", "ps-m09", "ddp", "hivemind", "p2p-paper", "p2p-defaults")
CONDITIONS = ("loopback", "300mbit", "ratio")
#: what each condition runs by default (``--systems`` replaces it): the single process once (it
#: has no network); in 300mbit, where only a parameter server's link is capped, only the servers
#: (the decentralised systems' runs there would be their loopback runs again: nothing is capped)
PLAN = {"loopback": ("single", "ps", "ddp", "hivemind", "p2p-paper", "p2p-defaults"),
        "300mbit": ("ps", "ps-m09"),
        "ratio": ("ps", "ddp", "hivemind", "p2p-paper", "p2p-defaults")}
#: which links a condition caps: none, the parameter server's only, or every machine's
SCOPE = {"loopback": "none", "300mbit": "server", "ratio": "every"}
EVAL = ["--set", "training.eval_samples=1000"]
#: p2pnode as in the paper: Algorithm 1 (exchange and publish every step, mean-threshold mask,
#: random peer, 1/2 averaging), top-1 % publishes, lr 0.05 (scripts/bench_cluster.py "paper")
P2P_PAPER = ["--set", "exchange.every=1", "--set", "compression.publish_every=1",
             "--set", "compression.publish=topk:density=0.01", "--set", "compression.gradient=mean-threshold",
             "--set", "exchange.peer_selection=random", "--set", "exchange.averaging=mean", "--set", "training.lr=0.05",
             # the paper's publishing: every step, float values (p2pnode's defaults: on fetch, int8)
             "--set", "compression.publish_on=steps", "--set", "compression.value_dtype=float32"]
#: the parameter server: dense weights served (as a classic PS), dense gradients pushed, one
#: momentum-SGD step per push at lr 0.05 (lr 0.2 per node / 4 pushers, the linear scaling rule),
#: server momentum 0.6: asynchrony with M pushers adds an implicit momentum of about 1 - 1/M
#: (Mitliagkas et al. 2016, "Asynchrony begets momentum"), 0.75 for 4, so 0.6 explicit keeps the
#: total near the 0.9 of the synchronous systems ((1 - 0.6) x (1 - 0.75) = 1 - 0.9)
PS_SERVER = ["--set", "node.role=ps", "--set", "compression.publish=topk:density=1.0", "--set", "training.lr=0.05",
             "--set", "training.momentum=0.6", "--set", "exchange.timeout=20",
             "--set", "http.snapshot_rate_per_source=0", "--set", "compression.value_dtype=float32"]
#: the same server with the synchronous systems' momentum 0.9 on top of asynchrony's: the first
#: full run's diverged at the ratio cap (test accuracy 10 % after ~200 pushes), so it runs only
#: where it is cheap (300mbit, the paper's setup)
PS_M09 = ["--set", "training.momentum=0.9"]
PS_WORKER = ["--set", "node.role=ps-worker", "--set", "exchange.timeout=20", "--set", "training.eval_every=0"]
SETTINGS = {
    "single": "one p2pnode worker alone, no peers (its shard and every value as run: the next column)",
    "ps": "p2pnode node.role=ps + 4 ps-workers: dense gradient pushes, dense weights, momentum SGD on the server "
          "with momentum 0.6 (0.9 less asynchrony's implicit momentum ~1 - 1/4), lr 0.05 per push (0.2 / 4), "
          "cosine over all pushes, asynchronous: " + " ".join(PS_SERVER[1::2]),
    "ps-m09": "as the parameter server, with momentum 0.9 on the server (on top of asynchrony's): "
              + " ".join(PS_M09[1::2]),
    "ddp": "PyTorch DDP over gloo (benchlib.ddp), synchronous: every step all-reduces the dense gradient",
    "hivemind": "hivemind Optimizer, use_local_updates=True: local momentum-SGD steps, parameters averaged "
                "every average_every local steps (target batch workers x 64 x average_every), "
                "target_group_size = workers, lr by hivemind's scheduler per epoch (warm-up, then cosine)",
    "p2p-paper": "p2pnode, Algorithm 1 as in the paper: " + " ".join(P2P_PAPER[1::2]),
    "p2p-defaults": "p2pnode's defaults (the schema's, which conf/node.toml shows), no --set beyond the "
                    "experiment's common ones",
}
#: the resolved p2pnode settings recorded for every node of a run (``config`` in its result
#: record): what the node's own configuration code made of its command line (p2pnode.cli)
SHOWN = ("node.role", "training.shard", "training.partition", "training.batch_size", "training.optimizer",
         "training.lr", "training.momentum", "training.lr_schedule", "training.warmup_samples",
         "training.grad_clip", "training.weight_decay", "training.max_samples", "training.outer",
         "training.eval_every", "training.eval_samples", "training.seed", "exchange.every",
         "exchange.peers_per_round", "exchange.averaging", "exchange.peer_selection", "exchange.robust",
         "exchange.timeout", "exchange.consensus_tolerance", "compression.gradient", "compression.gradient_memory",
         "compression.publish", "compression.publish_every", "compression.publish_on", "compression.value_dtype",
         "http.snapshot_rate_per_source")


def effective_config(command: list[str]) -> dict[str, Any]:
    """The settings a ``p2pnode start`` command line resolves to, by p2pnode's own parser and
    configuration code (the values a node of the run trained with, defaults included)."""
    from p2pnode import cli

    parser = argparse.ArgumentParser()
    cli._start_parser(parser.add_subparsers())
    cfg = cli.build_config(parser.parse_args(command[command.index("start"):]))
    out: dict[str, Any] = {}
    for key in SHOWN:
        section, name = key.split(".")
        out[key] = getattr(getattr(cfg, section), name)
    return out


def capped_nodes(cond: str, system: str) -> list[int] | None:
    """The namespaces whose links a run caps (None: all; []: none). Namespace 0 is the parameter
    server's, or rank 0 / node 0 of a decentralised system."""
    scope = SCOPE[cond]
    if scope == "every":
        return None
    if scope == "server" and system.startswith("ps"):
        return [0]
    return []


def capped_text(cond: str, system: str, rate: str) -> str:
    """What a run capped, in words (the log and the report print it for every run)."""
    nodes = capped_nodes(cond, system)
    if cond == "loopback":
        return "nothing: every process on 127.0.0.1"
    if nodes is None:
        return f"every machine's link, {rate} each way" + (" (the server's and its 4 workers')"
                                                            if system.startswith("ps") else "")
    if nodes:
        return f"only the parameter server's link, {rate} each way; its 4 workers' links uncapped"
    return "nothing (no server; each machine in its own network namespace)"


def log_sample(log: Path, run: str, node: int, t: float, step: int, samples: int, loss: float | None,
               acc: float | None) -> None:
    append_jsonl(log, {"kind": "sample", "run": run, "node": node, "t": round(t, 3), "step": step,
                       "samples": samples, "loss": loss, "acc": acc})


def loads() -> list[float]:
    """The 1, 5 and 15 minute load averages now."""
    return [round(v, 2) for v in os.getloadavg()]


def run_daemons(system: str, cond: str, run: str, args: argparse.Namespace, place: Place, topo: Topology | None,
                log: Path) -> dict[str, Any]:
    """Train one system of p2pnode daemons to the end, logging every node's progress."""
    samples, every = args.samples, args.eval_every
    if system == "single":
        n, node_args = 1, lambda i: [*training_args(0, 1, samples), *EVAL, "--set", f"training.eval_every={every}"]
    elif system.startswith("ps"):
        n = NODES + 1

        def node_args(i: int) -> list[str]:
            if i == 0:
                return [*training_args(0, 1, NODES * samples), *EVAL, *PS_SERVER,
                        *(PS_M09 if system == "ps-m09" else []),
                        "--set", f"training.eval_every={every * NODES}",
                        "--set", f"training.warmup_samples={3200 * NODES}"]
            return [*training_args(i - 1, NODES, samples), *PS_WORKER]
    else:
        extra = P2P_PAPER if system == "p2p-paper" else []
        n = NODES
        node_args = lambda i: [*training_args(i, NODES, samples, extra), *EVAL,
                               "--set", f"training.eval_every={every}"]
    root = Path(args.workdir) / run
    shutil.rmtree(root, ignore_errors=True)
    before = link_bytes(topo)
    cluster = Cluster(root, n, node_args, args.port, place)
    config = [{"node": i, **effective_config(node.command())} for i, node in enumerate(cluster.nodes)]
    last: dict[int, dict[str, Any]] = {}
    seen: dict[int, tuple[int, Any]] = {}
    start, shown, t0 = time.monotonic(), 0.0, None
    judged = range(1, n) if system.startswith("ps") else range(n)  # the server has no end of its own
    with cluster:
        while time.monotonic() - start < args.timeout:
            now = time.monotonic()
            for i, s in enumerate(cluster.statuses()):
                if s is None:
                    continue
                last[i] = s
                t = s["training"]
                if t["step"] and t0 is None:
                    t0 = now  # time 0: the first step of any node (start-up is not training)
                key, prev = (t["step"], t["eval_step"]), seen.get(i, (0, 0))
                if t0 is not None and prev != key:
                    seen[i] = key
                    acc = t["accuracy"] if t["eval_step"] and t["eval_step"] != prev[1] else None
                    log_sample(log, run, i, now - t0, t["step"], t["samples"], t["loss"], acc)
            if now - shown >= 5:
                shown = now
                print(f"  [{run}] {now - start:5.0f} s  steps {[last[i]['training']['step'] for i in sorted(last)]}  "
                      f"test acc {[last[i]['training']['accuracy'] for i in sorted(last)]}", flush=True)
            if all(i in last and finished(last[i]) for i in judged):
                break
            time.sleep(0.5)
        wall = time.monotonic() - (t0 or start)
    moved = [b - a for a, b in zip(before, link_bytes(topo))]
    server = system.startswith("ps")  # a parameter server's workers hold copies of its model: not evaluated
    evals = evaluate_checkpoints(TRAIN_IMAGES, [node.state_dir if not (server and i) else None
                                  for i, node in enumerate(cluster.nodes)])
    nodes = []
    for i in range(n):
        s = last.get(i, {})
        t, b = s.get("training", {}), s.get("bytes", {})
        app = b.get("client_sent", 0) + b.get("client_received", 0) + b.get("model_served", 0)
        app += s.get("ps", {}).get("bytes_received", 0)
        nodes.append({"node": i, "role": "server" if system.startswith("ps") and i == 0 else "worker", **evals[i],
                      "steps": t.get("step"), "samples": t.get("samples"), "train_seconds": t.get("train_seconds"),
                      "bytes": moved[i] if moved else app, "bytes_source": "link" if moved else "http"})
    return {"nodes": nodes, "wall": wall, "ok": all(i in last and finished(last[i]) for i in judged),
            "config": config}


def run_baseline(system: str, cond: str, run: str, args: argparse.Namespace, place: Place, topo: Topology | None,
                 log: Path) -> dict[str, Any]:
    """DDP or hivemind: per-step records from each rank's log folder, final models evaluated."""
    folder = Path(args.workdir) / run
    shutil.rmtree(folder, ignore_errors=True)
    before = link_bytes(topo)
    env = {"GLOO_SOCKET_IFNAME": "eth0"} if topo is not None else {}
    print(f"  [{run}] running (its per-step records are read at the end)", flush=True)
    started = time.monotonic()
    spec: DdpRun | HivemindRun
    if system == "ddp":
        spec = DdpRun(workers=NODES, samples=args.samples, log_dir=str(folder), eval_every=args.eval_every)
        results = [run_ddp(spec, place, wait=args.timeout, env=env)]
    else:
        spec = HivemindRun(workers=NODES, samples=args.samples, log_dir=str(folder), eval_every=args.eval_every)
        results = run_hivemind(spec, place, wait=args.timeout, env=env)
    # every field of the run as given, and what its module fixes; hivemind's version as installed
    fields = {k: v for k, v in asdict(spec).items() if k not in ("log_dir", "port")}
    config = [{**BASELINE_FIXED, **fields, **({"hivemind": version("hivemind")} if system == "hivemind" else {})}]
    wall = time.monotonic() - started
    moved = [b - a for a, b in zip(before, link_bytes(topo))]
    failed = [r["failed"] for r in results if "failed" in r]
    ranks = sorted(folder.glob("rank*.jsonl"))
    for r, path in enumerate(ranks):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            log_sample(log, run, r, rec["t"], rec["step"], rec["samples"], rec["loss"], rec["acc"])
    evals = evaluate_checkpoints(TRAIN_IMAGES, [folder / f"rank{r}" for r in range(NODES)])
    sent = results[0].get("sent") if system == "ddp" else None
    nodes = [{"node": r, "role": "worker", **evals[r], "steps": args.samples // 64, "samples": args.samples,
              "bytes": moved[r] if moved else (2 * sent / NODES if sent else None),
              "bytes_source": "link" if moved else ("computed" if sent else None)} for r in range(NODES)]
    return {"nodes": nodes, "wall": wall, "ok": not failed, "failed": failed[:1], "config": config}


def plan(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(condition, system) of every run, in order: each condition's PLAN (or ``--systems`` in
    each), the single process only in the first condition."""
    runs: list[tuple[str, str]] = []
    for cond in args.conditions:
        for system in (args.systems or PLAN[cond]):
            if system == "single" and any(s == "single" for _, s in runs):
                continue
            runs.append((cond, system))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the ratio condition, 4000 samples per worker (7 minutes at load 3.5-5.4)")
    ap.add_argument("--systems", nargs="+", default=None, choices=SYSTEMS,
                    help="run these in every condition (default: each condition's plan, see the docstring)")
    ap.add_argument("--conditions", nargs="+", default=None, choices=CONDITIONS,
                    help="default: all three (--quick: ratio)")
    ap.add_argument("--samples", type=int, default=0, help="training samples per worker (default 20000; quick 4000)")
    ap.add_argument("--eval-every", type=int, default=0, help="steps between periodic test evaluations")
    ap.add_argument("--ratio-rate", default="", help="the ratio condition's rate, instead of the recorded one")
    ap.add_argument("--measure-ratio", action="store_true",
                    help="measure the ratio condition's rate on this machine now (default: the recorded measurement)")
    ap.add_argument("--timeout", type=float, default=0, help="seconds one run may take (default 600; quick 240)")
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "experiment"))
    ap.add_argument("--jsonl", default="", help="the log, started afresh (default: the full run's "
                    f"{FULL_LOG.relative_to(ROOT)} for the whole plan, else WORKDIR/experiment.jsonl)")
    ap.add_argument("--append", action="store_true", help="add to the log instead of starting it afresh")
    ap.add_argument("--report", action="store_true", help="then write docs/EXPERIMENTS.md from the log "
                    "(done anyway after the whole plan with the default log)")
    args = ap.parse_args()
    # the whole plan, as issued with no flags (or only --timeout/--port/--workdir): the full run,
    # whose log is the committed one and whose report is docs/EXPERIMENTS.md
    whole = not (args.quick or args.systems or args.conditions or args.samples or args.eval_every
                 or args.ratio_rate or args.measure_ratio or args.jsonl or args.append)
    if whole:
        args.jsonl, args.report = str(FULL_LOG), True
    args.samples = args.samples or (4000 if args.quick else 20000)
    args.conditions = args.conditions or (["ratio"] if args.quick else list(CONDITIONS))
    args.eval_every = args.eval_every or (10 if args.quick else 25)
    args.timeout = args.timeout or (240 if args.quick else 600)
    if args.quick and args.systems is None:
        args.systems = [s for s in SYSTEMS if s != "ps-m09"]
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    log = Path(args.jsonl or Path(args.workdir) / "experiment.jsonl")
    if (reason := unavailable()) and set(args.conditions) - {"loopback"}:
        print(f"experiment.py: {reason}: only --conditions loopback can run", file=sys.stderr)
        return 2  # before the log is started afresh: a refused run leaves the last one's log
    runs = plan(args)
    if any(s == "hivemind" for _, s in runs) and (why := hivemind_unavailable()):
        # refused, not skipped: a report without its hivemind rows would replace the last whole one
        print(f"experiment.py: {why} (scripts/experiment.sh installs it; or leave hivemind out with --systems)",
              file=sys.stderr)
        return 2
    if not args.append:
        log.unlink(missing_ok=True)
    systems = list(dict.fromkeys(s for _, s in runs))
    append_jsonl(log, {"kind": "meta", "command": command_line(), "machine": machine(), "samples": args.samples,
                       "nodes": NODES, "eval_every": args.eval_every, "quick": args.quick, "settings": SETTINGS,
                       "systems": systems, "conditions": args.conditions, "timeout": args.timeout})
    print(f"== {len(runs)} runs: {', '.join(f'{c}/{s}' for c, s in runs)}; {args.samples} samples per worker",
          flush=True)
    began, done = time.monotonic(), 0
    for cond in args.conditions:
        todo = [s for c, s in runs if c == cond]
        rate = {"loopback": "unlimited", "300mbit": "300mbit"}.get(cond, "")
        if cond == "ratio":
            arith: dict[str, Any] = ({"rate": args.ratio_rate, "why": "--ratio-rate"} if args.ratio_rate
                                     else measure(NODES) if args.measure_ratio else {**MEASURED, "reused": True})
            rate = arith["rate"]
            append_jsonl(log, {"kind": "ratio", **arith})
            print(f"== ratio condition: {json.dumps(arith)}", flush=True)
        # the decentralised systems a server-only condition does not run: their loopback runs stand in
        borrowed = {s: "loopback" for s in PLAN["loopback"] if s != "single" and not s.startswith("ps")
                    and s not in todo} if SCOPE[cond] == "server" else {}
        append_jsonl(log, {"kind": "condition", "cond": cond, "rate": rate, "scope": SCOPE[cond],
                           "capped": {s: capped_text(cond, s, rate) for s in SYSTEMS}, "borrowed": borrowed})
        # a subnet of its own: other benchmarks' topologies use benchlib.netns's default 10.77.0
        topo = Topology(NODES + 1, tag="p2pex", subnet="10.79.0") if cond != "loopback" else None
        if topo is not None:
            topo.up()
        try:
            for system in todo:
                run = f"{cond}/{system}"
                place = topo.place if topo is not None else loopback
                if topo is not None:
                    topo.set_rate("unlimited")
                    if (nodes := capped_nodes(cond, system)) != []:
                        topo.set_rate(rate, nodes)
                done += 1
                capped = capped_text(cond, system, rate)
                print(f"== [{done}/{len(runs)}] {run} (capped: {capped}; {time.monotonic() - began:.0f} s so far; "
                      f"load {loads()})", flush=True)
                at_start = loads()
                runner = run_baseline if system in ("ddp", "hivemind") else run_daemons
                out = runner(system, cond, run, args, place, topo, log)
                append_jsonl(log, {"kind": "result", "run": run, "system": system, "cond": cond, "rate": rate,
                                   "capped": capped, "samples": args.samples, "settings": SETTINGS[system],
                                   "load": {"start": at_start, "end": loads()}, **out})
                accs = [n["test_acc"] for n in out["nodes"]]
                print(f"   done in {out['wall']:.0f} s, ok={out['ok']}, test accuracy {accs}", flush=True)
        finally:
            if topo is not None:
                topo.down()
    total = time.monotonic() - began
    append_jsonl(log, {"kind": "end", "wall": round(total, 1), "load": loads(), "runs": len(runs)})
    print(f"all {len(runs)} runs in {total:.0f} s ({total / 60:.1f} min); load {loads()}; log: {log}", flush=True)
    if args.report:
        import subprocess

        return subprocess.call([sys.executable, str(ROOT / "scripts" / "experiment_report.py"), str(log)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
