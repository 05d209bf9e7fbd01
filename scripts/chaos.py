#!/usr/bin/env python3
"""Chaos: 4 nodes train Fashion-MNIST while, every ``--interval`` seconds for ``--duration``, a
random node is SIGKILLed and restarted on its state dir, frozen (SIGSTOP of daemon and worker
for 10 s), or cut off from the others for 10 s (network namespaces, root only; otherwise no
cuts, said in the output), these three in turn. Then the cluster trains to the end and stops.

Checked, and printed as a table (exit code 1 if any fails):

- every node's final checkpoint on the 10 000 test images is at least ``--min-accuracy`` (88 %);
- no checkpoint lost: after every kill the node's checkpoint loads, and the restarted node
  resumes at least at that checkpoint's step;
- no leak: each node's daemon and worker hold no more file descriptors at the end than after
  they first started (plus ``--fd-slack``), no p2pnode process outlives the stop, and this
  script holds as many descriptors after as before.

Every node runs the benchmark settings (``benchlib.cluster.training_args``) and any ``--set
KEY=VALUE`` given (the synchronous mode: ``--set exchange.sync=powersgd --set
training.min_peers=3``).

Training length: ``--samples`` per node (default: what a node trains in ``--duration`` at 250
samples/s, a loaded 2-core machine's pace), cosine schedule, so the chaos falls in training.

    .venv/bin/python scripts/chaos.py                                # 20 minutes, a kill/freeze/cut a minute
    .venv/bin/python scripts/chaos.py --duration 90 --interval 20    # a quick look
    .venv/bin/python scripts/chaos.py --write                        # + docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib.cluster import ROOT, Cluster, NodeProc, checkpoint_accuracies, finished, loopback, training_args
from benchlib.netns import Topology, unavailable
from benchlib.procs import children, cmdline, pid_alive, worker_pid
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section
from benchlib.status import fetch_status, wait_for

SECTION = "## Chaos: kills, freezes and cut-offs during training"
PAUSE = 10.0  #: seconds a node stays frozen or cut off


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def pids(node: NodeProc) -> list[int]:
    """The node's daemon and worker."""
    return [node.pid, worker_pid(node.pid)]


def checkpoint_step(node: NodeProc) -> int | None:
    """The step of the node's checkpoint on disk, None if it is missing or does not load."""
    from p2pnode.checkpoint import CHECKPOINT_NAME, load

    try:
        state = load(node.state_dir / CHECKPOINT_NAME)
    except Exception:  # a damaged checkpoint is exactly what this looks for
        return None
    return None if state is None else int(state.get("step", 0))


class Chaos:
    def __init__(self, cluster: Cluster, topo: Topology | None, rng: random.Random, jsonl: str | None) -> None:
        self.cluster, self.topo, self.rng, self.jsonl = cluster, topo, rng, jsonl
        self.events: Counter[tuple[int, str]] = Counter()
        self.problems: list[str] = []
        self.every_pid: set[int] = set()

    def note(self, i: int, action: str, **extra: Any) -> None:
        self.events[(i, action)] += 1
        print(f"  {time.strftime('%H:%M:%S')} node{i}: {action} {extra or ''}", flush=True)
        append_jsonl(self.jsonl, {"bench": "chaos", "node": i, "action": action, **extra})

    def kill(self, i: int) -> None:
        node = self.cluster.nodes[i]
        node.signal(signal.SIGKILL)
        assert node.proc is not None
        node.proc.wait(10)
        step = checkpoint_step(node)
        if step is None and (node.state_dir / "checkpoint.pt").exists():
            self.problems.append(f"node{i}: checkpoint unreadable after a kill")
        time.sleep(2.0)
        node.start()
        s = node.wait_ready(120)
        self.every_pid.update(pids(node))
        resumed = s["training"]["step"]
        if step is not None and resumed < step:
            self.problems.append(f"node{i}: resumed at step {resumed}, its checkpoint had {step}")
        self.note(i, "kill", checkpoint_step=step, resumed_step=resumed)

    def freeze(self, i: int) -> None:
        group = pids(self.cluster.nodes[i])
        for pid in group:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(PAUSE)
        finally:
            for pid in group:
                os.kill(pid, signal.SIGCONT)
        self.note(i, "freeze")

    def cut(self, i: int) -> None:
        assert self.topo is not None
        self.topo.partition([i], [j for j in range(len(self.cluster.nodes)) if j != i])
        try:
            time.sleep(PAUSE)
        finally:
            self.topo.heal()
        self.note(i, "cut")

    def strike(self, k: int) -> None:
        """Strike k: a random node, the actions taken in turn (so a short run sees each)."""
        actions = ["kill", "freeze"] + (["cut"] if self.topo is not None else [])
        getattr(self, actions[k % len(actions)])(self.rng.randrange(len(self.cluster.nodes)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1200.0, help="seconds of chaos")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between strikes")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=0, help="training samples per node (0: duration x 250/s)")
    ap.add_argument("--min-accuracy", type=float, default=0.88)
    ap.add_argument("--fd-slack", type=int, default=16, help="descriptors a process may gain and not count as a leak")
    ap.add_argument("--no-netns", action="store_true", help="loopback, no cut-offs, even as root")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a node setting, every node (repeatable), e.g. --set exchange.sync=powersgd")
    ap.add_argument("--subnet", default="10.97.0", help="the namespaces' /24 (one no other benchmark uses)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for training to end after chaos")
    ap.add_argument("--port", type=int, default=7701)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "chaos"))
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    samples = args.samples or int(args.duration * 250)
    why = "--no-netns" if args.no_netns else unavailable()
    if why:
        print(f"no cut-offs: {why}", flush=True)
    own_fds = fds(os.getpid())
    run = Path(args.workdir)
    run.mkdir(parents=True, exist_ok=True)
    for old in run.glob("node*"):  # a fresh cluster
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    extra = [arg for kv in args.settings for arg in ("--set", kv)]
    topo = Topology(args.nodes, tag="p2pch", subnet=args.subnet).up() if not why else None
    try:
        place = topo.place if topo is not None else loopback
        cluster = Cluster(run, args.nodes, lambda i: training_args(i, args.nodes, samples, extra), args.port, place)
        chaos = Chaos(cluster, topo, random.Random(args.seed), args.jsonl)
        with cluster:
            for node in cluster.nodes:
                node.wait_ready(120)
            first_fds = {i: [fds(p) for p in pids(n)] for i, n in enumerate(cluster.nodes)}
            for n in cluster.nodes:
                chaos.every_pid.update(pids(n))
            start = time.monotonic()
            for k in range(1, int(args.duration // args.interval) + 1):  # a strike at every interval mark
                time.sleep(max(0.0, start + k * args.interval - time.monotonic()))
                chaos.strike(k - 1)
            print(f"chaos over after {time.monotonic() - start:.0f} s; training to the end", flush=True)
            wait_for(lambda: all((s := fetch_status(n.addr)) is not None and finished(s) for n in cluster.nodes),
                     args.timeout, "every node to finish training", interval=2.0)
            last_fds = {i: [fds(p) for p in pids(n)] for i, n in enumerate(cluster.nodes)}
            for n in cluster.nodes:
                chaos.every_pid.update(children(n.pid))
        try:  # a stopped daemon's children (its worker, multiprocessing's tracker) go within seconds
            wait_for(lambda: not any(pid_alive(p) for p in chaos.every_pid), 15, "the nodes' processes to exit")
        except AssertionError:
            pass
        left = sorted(f"{p} ({cmdline(p)[:60]})" for p in chaos.every_pid if pid_alive(p))
        if left:
            chaos.problems.append(f"processes left after the stop: {left}")
        if fds(os.getpid()) > own_fds:
            chaos.problems.append(f"this script holds {fds(os.getpid())} descriptors, {own_fds} before")
    finally:
        if topo is not None:
            topo.down()
    accs = checkpoint_accuracies(n.state_dir for n in cluster.nodes)
    rows = []
    for i, acc in enumerate(accs):
        leak = any(b >= 0 and a > b + args.fd_slack for a, b in zip(last_fds[i], first_fds[i]))
        if acc is None or acc < args.min_accuracy:
            chaos.problems.append(f"node{i}: accuracy {acc}")
        if leak:
            chaos.problems.append(f"node{i}: descriptors {first_fds[i]} -> {last_fds[i]} (daemon, worker)")
        rows.append([f"node{i}", f"{100 * acc:.2f} %" if acc is not None else "no checkpoint",
                     *(chaos.events[(i, a)] for a in ("kill", "freeze", "cut")),
                     f"{first_fds[i][0]} -> {last_fds[i][0]}", f"{first_fds[i][1]} -> {last_fds[i][1]}"])
    text = table(["node", "accuracy", "kills", "freezes", "cut-offs", "daemon fds", "worker fds"], rows)
    verdict = "every check held" if not chaos.problems else "FAILED: " + "; ".join(chaos.problems)
    print(text)
    print(verdict)
    append_jsonl(args.jsonl, {"bench": "chaos", "accuracies": accs, "problems": chaos.problems, "samples": samples})
    if args.write:
        write_section(f"{SECTION}\n\n{args.nodes} nodes, small CNN, Fashion-MNIST, IID, {samples} samples per node, "
                      f"cosine schedule; every {args.interval:g} s for {args.duration:g} s a random node killed and "
                      f"restarted, frozen {PAUSE:g} s or cut off {PAUSE:g} s"
                      f"{'' if topo is not None or not why else f' (no cut-offs: {why})'}"
                      f"{'; settings: ' + ' '.join(args.settings) if args.settings else ''}.\n\n```\n{command_line()}\n"
                      f"```\n\n- {machine()}\n\n{text}\n\n{verdict}\n")
    return 0 if not chaos.problems else 1


if __name__ == "__main__":
    sys.exit(main())
