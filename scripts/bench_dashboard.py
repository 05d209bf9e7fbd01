#!/usr/bin/env python3
"""Dashboard overhead: a node's training rate with one dashboard open on it, against none open.

A 3-node cluster trains (``benchlib.cluster.Cluster``; Fashion-MNIST if installed, else the
synthetic set; ring; training never ends: ``max_samples = 0``). Node 0 is measured, in rounds of
one ``--trial``-second trial per mode, each mode first in turn (so that a drift of the machine's
load hits every mode alike):

* **closed**: no dashboard open (the browser, if any, shows ``about:blank``, idle);
* **poller**: a thread of this script makes the page's requests on the page's schedule
  (``/v1/history?since=N`` and ``/v1/cluster`` every 2 s): the node's cost with nothing else;
* **browser**: a real headless Chromium (Debian's, through Playwright) shows node 0's dashboard
  (left out with ``--no-browser`` or where there is no Chromium).

The history sampler (one status read a second) runs in every mode: it is always on. Its own
cost is timed apart, in this process, on a real status document of node 0.

Node 0's rate is ``training.samples`` over a window that starts and ends on a change of that
counter (polled), so that it spans whole steps; CPU seconds of its daemon and its worker come
from /proc. Two ratios against *closed*, per round: samples per second (on a machine shared
with other people's jobs it swings by tens of per cent from one trial to the next), and samples
per CPU-second of the node (daemon + worker): other jobs taking CPU 0 slow samples and the
node's CPU alike and cancel out, while CPU the daemon spends on the dashboard counts against
it. Placement (``--pin``, default with 2+ CPUs): node 0's daemon and its worker on the first
CPU (they share it: what the dashboard costs the daemon is taken from training), the other
nodes, the browser and this script on the others ("other machines"). Priority (default as
root with pinning; ``--no-priority``): node 0 in a CPU cgroup of the largest weight, so that
other people's jobs on its CPU give way to it and the rate ratio measures the node, not its
neighbours. Figures: medians
over the rounds.

    .venv/bin/python scripts/bench_dashboard.py                          # ~13 min: 8 rounds of 3 x 30 s
    .venv/bin/python scripts/bench_dashboard.py --rounds 1 --trial 5     # a quick look
    .venv/bin/python scripts/bench_dashboard.py --write                  # + docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib.cluster import Cluster
from benchlib.procs import cpu_seconds, worker_pid
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section
from benchlib.status import get_json, sample_edge, wait_for
from p2pnode.dashboard.history import History  # noqa: E402

SECTION = "## Dashboard overhead"
CHROMIUM = os.environ.get("P2PNODE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGE_POLL_S = 2.0  # dashboard.js POLL_MS


class Poller:
    """What the page asks, on the page's schedule, from a thread of this process."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.on = threading.Event()
        self.stopped = threading.Event()
        self.requests = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.addr}{path}", timeout=5) as resp:
            self.requests += 1
            return json.load(resp)

    def _run(self) -> None:
        seq = 0
        while not self.stopped.is_set():
            if self.on.wait(0.2):
                try:
                    seq = self._get(f"/v1/history?since={seq}")["last_seq"]
                    self._get("/v1/cluster")
                except OSError:
                    pass
                self.stopped.wait(PAGE_POLL_S)

    def open(self) -> None:
        self.on.set()

    def close(self) -> None:
        self.on.clear()

    def quit(self) -> None:
        self.stopped.set()
        self.thread.join(10)


class Browser:
    """One headless Chromium tab: the dashboard (open) or about:blank (closed)."""

    def __init__(self, addr: str) -> None:
        from playwright.sync_api import sync_playwright

        self.addr = addr
        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 960})
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def open(self) -> None:
        self.page.goto(f"http://{self.addr}/")
        # (polled from here: page.wait_for_function compiles its predicate in the page, which the
        # page's CSP forbids)
        wait_for(lambda: self.page.evaluate("document.querySelectorAll('#cluster tbody tr').length >= 1"), 30,
                 "the dashboard to show the cluster")

    def close(self) -> None:
        self.page.goto("about:blank")

    def quit(self) -> None:
        self.browser.close()
        self.pw.stop()






CGROUP = Path("/sys/fs/cgroup/cpu") / f"p2pnode-bench-dashboard-{os.getpid()}"


def boost(pid: int) -> None:
    """Put process ``pid`` (every thread) in a CPU cgroup with the largest weight (root only): on a
    CPU shared with other people's jobs the node then takes the whole CPU whenever it wants it, so
    its rate is its own (and what the dashboard takes from it shows) instead of its neighbours'
    load. Plain nice is not enough: with autogroup scheduling it only ranks tasks of one session.
    Threads made later inherit the group."""
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.shares").write_text("262144")
        (CGROUP / "cgroup.procs").write_text(str(pid))
    except OSError as e:  # no cgroup v1 cpu controller here: nice, which autogroup may weaken
        print(f"cpu cgroup unavailable ({e}); using nice -20", file=sys.stderr)
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.setpriority(os.PRIO_PROCESS, int(task.name), -20)
            except (ProcessLookupError, PermissionError):
                pass


def unboost() -> None:
    """Move anything left back to the root group and remove ours."""
    if not CGROUP.exists():
        return
    for pid in (CGROUP / "cgroup.procs").read_text().split():
        try:
            (CGROUP.parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    try:
        CGROUP.rmdir()
    except OSError:
        pass


def trial(addr: str, daemon_pid: int, seconds: float, priority: bool = False) -> dict[str, float]:
    worker = worker_pid(daemon_pid)
    if priority:
        boost(daemon_pid)
        boost(worker)
    t0, s0 = sample_edge(addr, 2.0)
    d0, w0 = cpu_seconds(daemon_pid), cpu_seconds(worker)
    time.sleep(seconds)
    t1, s1 = sample_edge(addr, 2.0)
    d1, w1 = cpu_seconds(daemon_pid), cpu_seconds(worker)
    return {"rate": (s1 - s0) / (t1 - t0), "daemon_cpu": (d1 - d0) / (t1 - t0), "worker_cpu": (w1 - w0) / (t1 - t0),
            "per_cpu_s": (s1 - s0) / max(1e-9, (d1 - d0) + (w1 - w0))}


def sampler_cost(addr: str, n: int = 2000) -> float:
    """Seconds one history sample takes on node 0's real status document (this CPU)."""
    doc = get_json(addr, timeout=5)
    h = History(lambda: doc)
    start = time.perf_counter()
    for i in range(n):
        h.sample(doc, now=float(i))
    return (time.perf_counter() - start) / n


def summary(results: dict[str, list[dict[str, float]]], client: str) -> dict[str, Any]:
    """Per round, ``client`` against closed: ratios of samples/s and of samples per node
    CPU-second, and the daemon's extra CPU; their medians over the rounds."""
    pairs = list(zip(results[client], results["closed"], strict=True))
    out: dict[str, Any] = {
        "rate": [o["rate"] / c["rate"] for o, c in pairs],
        "per_cpu": [o["per_cpu_s"] / c["per_cpu_s"] for o, c in pairs],
        "daemon_cpu": [o["daemon_cpu"] - c["daemon_cpu"] for o, c in pairs],
    }
    out.update({f"median_{k}": statistics.median(v) for k, v in list(out.items())})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="rounds of one trial per mode (default 8)")
    ap.add_argument("--trial", type=float, default=30.0, help="seconds per trial (default 30)")
    ap.add_argument("--no-browser", dest="browser", action="store_false",
                    help="the poller only (also where there is no Chromium)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let every process run on any CPU")
    ap.add_argument("--no-priority", dest="priority", action="store_false",
                    help="leave node 0 at normal priority (by default, as root, a CPU cgroup of the largest weight)")
    ap.add_argument("--port", type=int, default=7781)
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    args.browser = args.browser and Path(CHROMIUM).exists()
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin and len(cpus) >= 2
    priority = args.priority and pin and os.geteuid() == 0
    node_cpu, rest = ({cpus[0]}, set(cpus[1:])) if pin else (set(cpus), set(cpus))
    if pin:
        os.sched_setaffinity(0, rest)  # this script, its threads and the browser it starts

    def place(i: int) -> tuple[list[str], str]:
        chosen = node_cpu if i == 0 else rest
        return (["taskset", "-c", ",".join(map(str, sorted(chosen)))] if pin else []), "127.0.0.1"

    data = "fashion-mnist" if Path("/usr/share/datasets/fashion-mnist").exists() else "synthetic"
    node_args = ["--data", data, "--set", "training.max_samples=0", "--set", "exchange.peer_selection=ring"]
    modes = ["closed", "poller", *(["browser"] if args.browser else [])]
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        cl = Cluster(Path(tmp), 3, lambda i: [*node_args, "--shard", f"{i}/3"], args.port, place)
        with cl:
            addr = cl.nodes[0].addr
            for n in cl.nodes:
                n.wait_ready(timeout=180)
            wait_for(lambda: get_json(addr)["exchanges"]["done"] >= 3, 120, "node 0 to exchange")
            clients: dict[str, Browser | Poller] = {"poller": Poller(addr)}
            try:
                if args.browser:
                    clients["browser"] = Browser(addr)
                for r in range(args.rounds):
                    for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # each mode first in turn
                        for name, c in clients.items():
                            if name != mode:
                                c.close()
                        if mode in clients:
                            clients[mode].open()
                        time.sleep(2.0)  # the page loaded, its first polls done
                        results[mode].append(trial(addr, cl.nodes[0].pid, args.trial, priority))
                    print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                        f"{m} {results[m][-1]['rate']:.1f} samples/s, {results[m][-1]['per_cpu_s']:.1f}/CPU-s"
                        for m in modes), flush=True)
                per_sample = sampler_cost(addr)
            finally:
                if "browser" in clients:
                    errors = clients["browser"].errors  # type: ignore[union-attr]
                for c in clients.values():
                    c.quit()
                unboost()

    def mid(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    rows = [[mode, len(results[mode]), f"{mid(mode, 'rate'):.1f}", f"{mid(mode, 'per_cpu_s'):.1f}",
             f"{100 * mid(mode, 'daemon_cpu'):.2f} %", f"{100 * mid(mode, 'worker_cpu'):.1f} %"] for mode in modes]
    sums = {m: summary(results, m) for m in modes[1:]}
    what = {"poller": "a client making the page's requests on its schedule (a thread of the benchmark)",
            "browser": "the dashboard open in a headless Chromium (Debian's, through Playwright)"}
    lines = [
        SECTION, "",
        f"`{command_line()}` (`--write` puts this section here)", "",
        f"{machine()}. A 3-node cluster ({data}, ring, training without end). Node 0's training with no "
        f"dashboard open (*closed*), with {what['poller']} (*poller*)"
        + (f" and with {what['browser']} (*browser*)" if args.browser else "")
        + f": {args.rounds} rounds of one {args.trial:.0f} s trial per mode, each mode first in turn; "
        + ("node 0 (daemon and worker) pinned to one CPU, the other nodes, the browser and the benchmark to the "
           "other." if pin else "no CPU pinning.")
        + (" Node 0 (daemon and worker) in a CPU cgroup of the largest weight, so that other jobs on its "
           "CPU give way to it and its rate is its own." if priority else ""), "",
        table(["dashboard", "trials", "samples/s", "samples per node CPU-s", "daemon CPU", "worker CPU"], rows),
        "", "Medians over the trials. Against *closed*, median over the rounds:", "",
        table(["dashboard", "samples/s ratio", "per node CPU-s ratio", "daemon CPU, more"],
              [[m, f"{v['median_rate']:.4f}", f"**{v['median_per_cpu']:.4f}**", f"{100 * v['median_daemon_cpu']:+.2f} %"]
               for m, v in sums.items()]), "",
        f"The history sampler (always on) takes {per_sample * 1e6:.0f} µs a second ({per_sample * 100:.3f} % of "
        f"one CPU)." + (f" Browser console errors: {len(errors)}." if args.browser else ""),
    ]
    text = "\n".join(lines)
    print(text)
    append_jsonl(args.jsonl, {"bench": "dashboard", "pin": pin, "priority": priority, "trial_s": args.trial, "data": data,
                              "trials": results, "summary": sums, "sampler_s": per_sample})
    if args.write:
        write_section(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
