#!/usr/bin/env python3
"""Dashboard overhead: a node's training rate with one dashboard open on it, against none open.

A 3-node cluster trains (``benchlib.cluster.Cluster``; Fashion-MNIST if installed, else the
synthetic set; training never ends: ``max_samples = 0``). Node 0 is measured. Trials alternate
*open* and *closed* (pairs, the order flipped every pair so that a drift of the machine's load
hits both alike), each ``--trial`` seconds long:

* **open**: a real headless Chromium (Debian's, through Playwright) shows node 0's dashboard
  (``--client browser``, the default where there is one), or a Python client makes the page's
  requests on the page's schedule (``--client poller``: ``/v1/history?since=N`` and
  ``/v1/cluster`` every 2 s);
* **closed**: the browser shows ``about:blank`` (it stays running, idle), or the poller waits.

The history sampler (one status read a second) runs in both: it is always on. Its own cost is
timed apart, in this process, on a real status document of node 0.

Node 0's rate is ``training.samples`` over a window that starts and ends on a change of that
counter (polled), so that it spans whole steps; CPU seconds of its daemon and its worker come
from /proc. Two ratios open/closed per pair: samples per second (what the issue asks; on a
machine shared with other people's jobs it swings by tens of per cent from one trial to the
next), and samples per CPU-second of the node (daemon + worker): other jobs taking CPU 0 slow
both samples and the node's CPU alike and cancel out, while CPU the daemon spends on the
dashboard counts against it, so this one shows the dashboard's cost with far less noise.
Placement (``--pin``, default with 2+ CPUs): node 0's daemon and its worker on CPU 0 (they
share it: what the dashboard costs the daemon is taken from training), the other nodes, the
browser and this script on the other CPUs ("other machines"). The figure is the median over
pairs of open/closed.

    .venv/bin/python scripts/bench_dashboard.py                       # ~8 min: 6 pairs of 30 s
    .venv/bin/python scripts/bench_dashboard.py --pairs 2 --trial 10  # a quick look
    .venv/bin/python scripts/bench_dashboard.py --write               # + docs/BENCHMARKS.md
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib.cluster import Cluster
from benchlib.procs import cpu_seconds, worker_pid
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section
from benchlib.status import get_json, wait_for
from p2pnode.daemon.history import History  # noqa: E402

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
        self.page.wait_for_function("document.querySelectorAll('#cluster tbody tr').length >= 1", timeout=30_000)

    def close(self) -> None:
        self.page.goto("about:blank")

    def quit(self) -> None:
        self.browser.close()
        self.pw.stop()


def samples(addr: str) -> int:
    return int(get_json(addr, timeout=5)["training"]["samples"])


def edge(addr: str, limit: float = 2.0) -> tuple[float, int]:
    """The moment node ``addr``'s sample counter changes (to within a poll), and its new value."""
    first = samples(addr)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        now = samples(addr)
        if now != first:
            return time.monotonic(), now
        time.sleep(0.01)
    return time.monotonic(), samples(addr)


def trial(addr: str, daemon_pid: int, seconds: float) -> dict[str, float]:
    worker = worker_pid(daemon_pid)
    t0, s0 = edge(addr)
    d0, w0 = cpu_seconds(daemon_pid), cpu_seconds(worker)
    time.sleep(seconds)
    t1, s1 = edge(addr)
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6, help="open/closed pairs (default 6)")
    ap.add_argument("--trial", type=float, default=30.0, help="seconds per trial (default 30)")
    ap.add_argument("--client", choices=("browser", "poller", "auto"), default="auto")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let every process run on any CPU")
    ap.add_argument("--port", type=int, default=7781)
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    client_kind = args.client
    if client_kind == "auto":
        client_kind = "browser" if Path(CHROMIUM).exists() else "poller"
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin and len(cpus) >= 2
    node_cpu, rest = ({cpus[0]}, set(cpus[1:])) if pin else (set(cpus), set(cpus))
    if pin:
        os.sched_setaffinity(0, rest)  # this script, its threads and the browser it starts

    def place(i: int) -> tuple[list[str], str]:
        chosen = node_cpu if i == 0 else rest
        return (["taskset", "-c", ",".join(map(str, sorted(chosen)))] if pin else []), "127.0.0.1"

    data = ["--data", "fashion-mnist"] if Path("/usr/share/datasets/fashion-mnist").exists() else ["--data", "synthetic"]
    node_args = [*data, "--set", "training.max_samples=0", "--set", "exchange.peer_selection=ring"]
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        cl = Cluster(Path(tmp), 3, lambda i: [*node_args, "--shard", f"{i}/3"], args.port, place)
        with cl:
            addr = cl.nodes[0].addr
            for n in cl.nodes:
                n.wait_ready(timeout=180)
            wait_for(lambda: get_json(addr)["exchanges"]["done"] >= 3, 120, "node 0 to exchange")
            client: Browser | Poller = Browser(addr) if client_kind == "browser" else Poller(addr)
            results: dict[str, list[dict[str, float]]] = {"open": [], "closed": []}
            ratios: list[float] = []
            cpu_extra: list[float] = []  # daemon CPU open - closed, per pair (fraction of a core)
            per_cpu: list[float] = []  # samples per node CPU-second, open / closed, per pair
            try:
                actions: dict[str, Callable[[], None]] = {"open": client.open, "closed": client.close}
                for p in range(args.pairs):
                    order = ("open", "closed") if p % 2 == 0 else ("closed", "open")
                    got = {}
                    for mode in order:
                        actions[mode]()
                        time.sleep(2.0)  # the page loaded, first polls done
                        got[mode] = trial(addr, cl.nodes[0].pid, args.trial)
                        results[mode].append(got[mode])
                    ratios.append(got["open"]["rate"] / got["closed"]["rate"])
                    cpu_extra.append(got["open"]["daemon_cpu"] - got["closed"]["daemon_cpu"])
                    per_cpu.append(got["open"]["per_cpu_s"] / got["closed"]["per_cpu_s"])
                    print(f"pair {p + 1}/{args.pairs}: open {got['open']['rate']:.1f} samples/s, closed "
                          f"{got['closed']['rate']:.1f}, ratio {ratios[-1]:.4f}; per node CPU-second "
                          f"{per_cpu[-1]:.4f}; daemon CPU {100 * cpu_extra[-1]:+.2f} %", flush=True)
                per_sample = sampler_cost(addr)
            finally:
                errors = client.errors if isinstance(client, Browser) else []
                client.quit()
    med = statistics.median(ratios)
    def mid(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    rows = [[mode, len(results[mode]), f"{mid(mode, 'rate'):.1f}", f"{mid(mode, 'per_cpu_s'):.1f}",
             f"{100 * mid(mode, 'daemon_cpu'):.1f} %", f"{100 * mid(mode, 'worker_cpu'):.1f} %"]
            for mode in ("closed", "open")]
    med_cpu = statistics.median(per_cpu)
    text = "\n".join([
        SECTION, "",
        f"`{command_line()}`", "",
        f"{machine()}. A 3-node cluster ({data[1]}, ring, training without end); node 0's training rate "
        f"with its dashboard open in {'a headless Chromium' if client_kind == 'browser' else 'a client polling like the page'} "
        f"and with none open, {args.pairs} alternating pairs of {args.trial:.0f} s trials; "
        + ("node 0 (daemon and worker) pinned to one CPU, everything else to the others." if pin
           else "no CPU pinning."), "",
        table(["dashboard", "trials", "samples/s", "samples per node CPU-s", "daemon CPU", "worker CPU"], rows),
        "", "(medians over the trials)", "",
        f"Median ratio open/closed over the pairs, samples per node CPU-second: **{med_cpu:.4f}** (cost "
        f"{100 * (1 - med_cpu):.2f} %; pairs: {', '.join(f'{r:.3f}' for r in per_cpu)}). "
        f"Samples per second: {med:.4f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)}). "
        f"Node 0's daemon used {100 * statistics.median(cpu_extra):+.2f} % of a CPU more with the page open "
        f"(median over the pairs): the dashboard's own cost, which training on a shared core can lose at most. "
        f"The history sampler, always on, takes {per_sample * 1e6:.0f} µs a second "
        f"({per_sample * 100:.3f} % of one CPU)."
        + (f" Browser console errors: {len(errors)}." if client_kind == "browser" else ""),
    ])
    print(text)
    append_jsonl(args.jsonl, {"bench": "dashboard", "client": client_kind, "pin": pin, "trial_s": args.trial,
                              "ratios": ratios, "median_ratio": med, "daemon_cpu_extra": cpu_extra,
                              "per_cpu_ratios": per_cpu, "median_per_cpu_ratio": med_cpu, "trials": results, "sampler_s": per_sample})
    if args.write:
        write_section(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
