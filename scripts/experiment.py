#!/usr/bin/env python3
"""The paper's evaluation (Cui 2019, Section IV) as one command: a single process, an asynchronous
parameter server (p2pnode's ``node.role = ps``), PyTorch DDP (gloo), hivemind, and p2pnode as
in the paper and with its defaults, on the same model (the small CNN), data (Fashion-MNIST,
one shard per worker), batch size (64) and samples per worker, under three networks:

* ``loopback``: every process on 127.0.0.1, no limit;
* ``300mbit``: every machine in its own network namespace, its link capped both ways at
  300 Mbit/s (``tc tbf``, benchlib.netns), the paper's bandwidth. The parameter server is one
  more machine; its link carries every worker's pushes and pulls, so it is the bottleneck, as
  in the paper;
* ``ratio``: every link capped at the rate that gives this CNN the paper's ratio of dense
  transfer time to compute per batch (the arithmetic is written to the log and the report).

Every node's progress is polled twice a second (step, loss, periodic test accuracy) and each
run ends with its final models evaluated on the 10 000 test images and on 5 000 training
images. Everything goes to one JSON-lines log (``--jsonl``); ``scripts/experiment_report.py``
turns it into docs/EXPERIMENTS.md with the paper's tables side by side and the figures.

    sudo .venv/bin/python scripts/experiment.py --quick          # under 10 minutes
    sudo .venv/bin/python scripts/experiment.py                  # the full run (its capped conditions alone took ~58 min on 2 shared cores)

Needs root for the namespaces (without it, only ``--conditions loopback`` runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.cluster import ROOT, Cluster, Place, finished, loopback, training_args
from benchlib.ddp import DdpRun, run_ddp
from benchlib.hivemind_run import HivemindRun, run_hivemind
from benchlib.hivemind_run import unavailable as hivemind_unavailable
from benchlib.netns import Topology, unavailable
from benchlib.results import append_jsonl, command_line, machine

NODES = 4
#: the paper's numbers behind the ratio condition: VGG-19 for CIFAR-10 (20.04 M parameters, as
#: torchvision's VGG-19 features with a 512-wide classifier), float32, on its 300 Mbit/s links;
#: its fastest decentralised batch (Table I: 0.58 s) bounds its compute per batch from above
PAPER_PARAMS, PAPER_LINK_BITS, PAPER_BATCH_S = 20.04e6, 300e6, 0.58
#: training images each final model is evaluated on (Table II)
TRAIN_IMAGES = 5000
SYSTEMS = ("single", "ps", "ps-m06", "ddp", "hivemind", "p2p-paper", "p2p-defaults")
CONDITIONS = ("loopback", "300mbit", "ratio")
EVAL = ["--set", "training.eval_samples=1000"]
#: p2pnode as in the paper: Algorithm 1 (exchange and publish every step, mean-threshold mask,
#: random peer, 1/2 averaging), top-1 % publishes, lr 0.05 (scripts/bench_cluster.py "paper")
P2P_PAPER = ["--set", "exchange.every=1", "--set", "compression.publish_every=1",
             "--set", "compression.publish=topk:density=0.01", "--set", "compression.gradient=mean-threshold",
             "--set", "exchange.peer_selection=random", "--set", "exchange.averaging=mean", "--set", "training.lr=0.05"]
#: the parameter server: dense weights served (as a classic PS), dense gradients pushed, one
#: momentum-SGD step per push at lr 0.05 (lr 0.2 per node / 4 pushers, the linear scaling rule)
PS_SERVER = ["--set", "node.role=ps", "--set", "compression.publish=topk:density=1.0", "--set", "training.lr=0.05",
             "--set", "exchange.timeout=20", "--set", "http.snapshot_rate_per_source=0"]
#: the same server with momentum 0.6: asynchrony with M pushers adds an implicit momentum of about
#: 1 - 1/M (Mitliagkas et al. 2016, "Asynchrony begets momentum"), 0.75 for 4, so 0.6 explicit keeps
#: the total near the 0.9 of the synchronous systems ((1 - 0.6) x (1 - 0.75) = 1 - 0.9); with 0.9 on
#: top of it the full run's server diverged (test accuracy 10 % after ~200 pushes at the ratio cap)
PS_M06 = ["--set", "training.momentum=0.6"]
PS_WORKER = ["--set", "node.role=ps-worker", "--set", "exchange.timeout=20", "--set", "training.eval_every=0"]
SETTINGS = {
    "single": "one p2pnode worker alone on one shard: momentum SGD 0.9, lr 0.2, cosine, batch 64",
    "ps": "p2pnode node.role=ps + 4 ps-workers: dense gradient pushes, dense weights, momentum SGD 0.9 on the "
          "server, lr 0.05 per push (0.2 / 4), cosine over all pushes, asynchronous",
    "ps-m06": "as the parameter server, with momentum 0.6 on the server (0.9 less asynchrony's implicit momentum "
              "~1 - 1/4): " + " ".join(PS_M06[1::2]),
    "ddp": "PyTorch DDP over gloo (benchlib.ddp): momentum SGD 0.9, lr 0.2, cosine, batch 64 per rank",
    "hivemind": "hivemind 1.1.12 Optimizer, use_local_updates=True, parameters averaged every 16 local steps "
                "(target batch 4 x 64 x 16), matchmaking_time 5 s, target_group_size 4, averaging_timeout 15 s, "
                "momentum SGD 0.9, lr 0.2 with a linear warm-up over 3200 samples then cosine (hivemind's "
                "scheduler, per epoch), gradient clipping at norm 5",
    "p2p-paper": "p2pnode, Algorithm 1 as in the paper: " + " ".join(P2P_PAPER[1::2]),
    "p2p-defaults": "p2pnode defaults (conf/node.toml)",
}


def log_sample(log: Path, run: str, node: int, t: float, step: int, samples: int, loss: float | None,
               acc: float | None) -> None:
    append_jsonl(log, {"kind": "sample", "run": run, "node": node, "t": round(t, 3), "step": step,
                       "samples": samples, "loss": loss, "acc": acc})


def link_bytes(topo: Topology | None) -> list[int]:
    """Bytes each namespace's link carried so far, both ways (empty on loopback)."""
    if topo is None:
        return []
    out = []
    for veth in topo.veth:
        stats = Path(f"/sys/class/net/{veth}/statistics")
        out.append(int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text()))
    return out


def evaluate_checkpoints(dirs: list[Path]) -> list[dict[str, float | None]]:
    """Each final model on the 10 000 test images and the first TRAIN_IMAGES training images."""
    import torch

    from benchlib.steplog import evaluate
    from p2pnode.checkpoint import CHECKPOINT_NAME, load
    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    torch.set_num_threads(1)
    test, train = fashion_mnist(False), fashion_mnist(True)
    model = build_model("cnn")
    out: list[dict[str, float | None]] = []
    for d in dirs:
        state = load(d / CHECKPOINT_NAME)
        if state is None:
            out.append({"test_acc": None, "train_acc": None})
            continue
        model.load_state_dict(state["model"])
        out.append({"test_acc": evaluate(model, test), "train_acc": evaluate(model, train, TRAIN_IMAGES)})
    return out


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
                        *(PS_M06 if system == "ps-m06" else []),
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
    evals = evaluate_checkpoints([node.state_dir for node in cluster.nodes])
    nodes = []
    for i in range(n):
        s = last.get(i, {})
        t, b = s.get("training", {}), s.get("bytes", {})
        app = b.get("client_sent", 0) + b.get("client_received", 0) + b.get("model_served", 0)
        app += s.get("ps", {}).get("bytes_received", 0)
        nodes.append({"node": i, "role": "server" if system.startswith("ps") and i == 0 else "worker", **evals[i],
                      "steps": t.get("step"), "samples": t.get("samples"), "train_seconds": t.get("train_seconds"),
                      "bytes": moved[i] if moved else app, "bytes_source": "link" if moved else "http"})
    return {"nodes": nodes, "wall": wall, "ok": all(i in last and finished(last[i]) for i in judged)}


def run_baseline(system: str, cond: str, run: str, args: argparse.Namespace, place: Place, topo: Topology | None,
                 log: Path) -> dict[str, Any]:
    """DDP or hivemind: per-step records from each rank's log folder, final models evaluated."""
    folder = Path(args.workdir) / run
    shutil.rmtree(folder, ignore_errors=True)
    before = link_bytes(topo)
    env = {"GLOO_SOCKET_IFNAME": "eth0"} if topo is not None else {}
    print(f"  [{run}] running (its per-step records are read at the end)", flush=True)
    started = time.monotonic()
    if system == "ddp":
        results = [run_ddp(DdpRun(workers=NODES, samples=args.samples, log_dir=str(folder), eval_every=args.eval_every),
                           place, wait=args.timeout, env=env)]
    else:
        results = run_hivemind(HivemindRun(workers=NODES, samples=args.samples, log_dir=str(folder),
                                           eval_every=args.eval_every), place, wait=args.timeout, env=env)
    wall = time.monotonic() - started
    moved = [b - a for a, b in zip(before, link_bytes(topo))]
    failed = [r["failed"] for r in results if "failed" in r]
    ranks = sorted(folder.glob("rank*.jsonl"))
    for r, path in enumerate(ranks):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            log_sample(log, run, r, rec["t"], rec["step"], rec["samples"], rec["loss"], rec["acc"])
    evals = evaluate_checkpoints([folder / f"rank{r}" for r in range(NODES)])
    sent = results[0].get("sent") if system == "ddp" else None
    nodes = [{"node": r, "role": "worker", **evals[r], "steps": args.samples // 64, "samples": args.samples,
              "bytes": moved[r] if moved else (2 * sent / NODES if sent else None),
              "bytes_source": "link" if moved else ("computed" if sent else None)} for r in range(NODES)]
    return {"nodes": nodes, "wall": wall, "ok": not failed, "failed": failed[:1]}


def batch_seconds() -> tuple[float, float]:
    """(seconds of one training batch of the CNN on one core, measured here; the same with
    NODES workers sharing this machine's cores, as they do in every run)."""
    import os

    import torch
    import torch.nn.functional as F

    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    torch.set_num_threads(1)
    train = fashion_mnist(True)
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(25):
        x, y = train.images[64 * i:64 * i + 64], train.labels[64 * i:64 * i + 64]
        began = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - began)
    one = statistics.median(times[5:])
    return one, one * max(1.0, NODES / (os.cpu_count() or 1))


def ratio_rate() -> tuple[str, dict[str, Any]]:
    """The link rate that gives the small CNN the paper's ratio of dense transfer time to
    compute per batch: its dense bits / (ratio x its seconds per batch on this machine)."""
    from p2pnode.models import build_model

    params = sum(p.numel() for p in build_model("cnn").parameters())
    paper_transfer = PAPER_PARAMS * 32 / PAPER_LINK_BITS
    ratio = paper_transfer / PAPER_BATCH_S
    one_core, shared = batch_seconds()
    bits = params * 32
    rate_mbit = bits / (ratio * shared) / 1e6
    rate = f"{max(1, round(rate_mbit))}mbit"
    return rate, {"rate": rate, "paper_params": PAPER_PARAMS, "paper_dense_transfer_s": round(paper_transfer, 3),
                  "paper_batch_s": PAPER_BATCH_S, "ratio": round(ratio, 3), "cnn_params": params,
                  "cnn_dense_mbit": round(bits / 1e6, 3), "cnn_batch_one_core_s": round(one_core, 4),
                  "cnn_batch_s": round(shared, 4), "nodes": NODES, "cores": __import__("os").cpu_count(),
                  "rate_mbit": round(rate_mbit, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples per worker (under 10 minutes)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--conditions", nargs="+", default=None, choices=CONDITIONS,
                    help="default: all three (--quick: ratio); the single process runs once, in the first")
    ap.add_argument("--samples", type=int, default=0, help="training samples per worker (default 30000; quick 5000)")
    ap.add_argument("--eval-every", type=int, default=0, help="steps between periodic test evaluations")
    ap.add_argument("--ratio-rate", default="", help="the ratio condition's rate, instead of measuring it")
    ap.add_argument("--timeout", type=float, default=0, help="seconds one run may take")
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "experiment"))
    ap.add_argument("--jsonl", default="", help="the log (default: WORKDIR/experiment.jsonl, started afresh)")
    ap.add_argument("--append", action="store_true", help="add to the log instead of starting it afresh")
    ap.add_argument("--report", action="store_true", help="then write docs/EXPERIMENTS.md from the log")
    args = ap.parse_args()
    args.samples = args.samples or (4000 if args.quick else 30000)
    args.conditions = args.conditions or (["ratio"] if args.quick else list(CONDITIONS))
    args.eval_every = args.eval_every or (10 if args.quick else 25)
    args.timeout = args.timeout or (240 if args.quick else 900)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    log = Path(args.jsonl or Path(args.workdir) / "experiment.jsonl")
    if not args.append:
        log.unlink(missing_ok=True)
    if (reason := unavailable()) and set(args.conditions) - {"loopback"}:
        print(f"experiment.py: {reason}: only --conditions loopback can run", file=sys.stderr)
        return 2
    systems = list(args.systems)
    if "hivemind" in systems and (why := hivemind_unavailable()):
        print(f"experiment.py: skipping hivemind: {why}", file=sys.stderr)
        systems.remove("hivemind")
    append_jsonl(log, {"kind": "meta", "command": command_line(), "machine": machine(), "samples": args.samples,
                       "nodes": NODES, "eval_every": args.eval_every, "quick": args.quick, "settings": SETTINGS,
                       "systems": systems, "conditions": args.conditions})
    began = time.monotonic()
    for cond in args.conditions:
        rate = "unlimited"
        if cond == "300mbit":
            rate = "300mbit"
        elif cond == "ratio":
            rate, why = (args.ratio_rate, {"rate": args.ratio_rate, "why": "--ratio-rate"}) if args.ratio_rate \
                else ratio_rate()
            append_jsonl(log, {"kind": "ratio", **why})
            print(f"== ratio condition: {json.dumps(why)}", flush=True)
        # a subnet of its own: other benchmarks' topologies use benchlib.netns's default 10.77.0
        topo = Topology(NODES + 1, tag="p2pex", subnet="10.79.0") if cond != "loopback" else None
        if topo is not None:
            topo.up()
            topo.set_rate(rate)
        try:
            for system in systems:
                if system == "single" and cond != args.conditions[0]:
                    continue  # no network: one run stands for every condition
                run = f"{cond}/{system}"
                place = topo.place if topo is not None else loopback
                print(f"== {run} (link {rate}; {time.monotonic() - began:.0f} s so far)", flush=True)
                runner = run_baseline if system in ("ddp", "hivemind") else run_daemons
                out = runner(system, cond, run, args, place, topo, log)
                append_jsonl(log, {"kind": "result", "run": run, "system": system, "cond": cond, "rate": rate,
                                   "samples": args.samples, "settings": SETTINGS[system], **out})
                accs = [n["test_acc"] for n in out["nodes"]]
                print(f"   done in {out['wall']:.0f} s, ok={out['ok']}, test accuracy {accs}", flush=True)
        finally:
            if topo is not None:
                topo.down()
    print(f"all runs in {time.monotonic() - began:.0f} s; log: {log}", flush=True)
    if args.report:
        import subprocess

        return subprocess.call([sys.executable, str(ROOT / "scripts" / "experiment_report.py"), str(log)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
