"""Thin links: p2pnode against PyTorch DDP when every machine has a slow network connection.

Each of the 4 workers gets its own Linux network namespace, joined to a bridge by a veth pair
whose both ends carry a token-bucket filter (`tc qdisc ... tbf`) at the given rate: every node
can upload and download at that rate, as on a LAN of ordinary machines or a thin office link.
(The kernel here has no netem, so there is no added latency: a link is only slow, not far.)
For each rate, DDP over gloo and the p2pnode defaults run on the same topology, one after the
other, on the same data and model as scripts/bench_cluster.py and scripts/bench_ddp.py.
Bytes are read from the veth counters: what really crossed the links, headers included.

    sudo .venv/bin/python scripts/bench_thin.py [--rates unlimited 1gbit 100mbit 25mbit]

DDP on a very thin link would need many minutes: with --ddp-max-seconds it stops after that long
and its row gives the pace (steps done, and the time the full run would take at that pace) with
no accuracy. Needs root, iproute2 and the tbf qdisc; writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_cluster import run_variant, write_section  # noqa: E402

SUBNET = "10.77.0"
BRIDGE = "p2pthinbr"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


class Topology:
    """n namespaces on one bridge in the root namespace (which polls status through it)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ns = [f"p2pthin{i}" for i in range(n)]
        self.veth = [f"p2pthv{i}" for i in range(n)]  # host ends; the namespace end is eth0
        self.ip = [f"{SUBNET}.{i + 1}" for i in range(n)]

    def up(self) -> None:
        self.down()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.254/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for ns, veth, ip in zip(self.ns, self.veth, self.ip):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", BRIDGE)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def set_rate(self, rate: str) -> None:
        """Limit both directions of every node's link (``unlimited``: remove the limit)."""
        for ns, veth in zip(self.ns, self.veth):
            for where in (["ip", "netns", "exec", ns], []):
                dev = "eth0" if where else veth
                sh(*where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if rate != "unlimited":
                    # burst: a few full-size packets; latency: how long a packet may queue
                    sh(*where, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                       "burst", "64kb", "latency", "100ms")

    def counters(self) -> tuple[int, int]:
        """Bytes the nodes sent and received in all, from the host ends of their veths."""
        sent = received = 0
        for veth in self.veth:
            stats = Path(f"/sys/class/net/{veth}/statistics")
            sent += int((stats / "rx_bytes").read_text())
            received += int((stats / "tx_bytes").read_text())
        return sent, received

    def place(self, i: int) -> tuple[list[str], str]:
        return ["ip", "netns", "exec", self.ns[i]], self.ip[i]

    def down(self) -> None:
        for ns, veth in zip(self.ns, self.veth):
            sh("ip", "link", "del", veth, check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)


def run_ddp(topo: Topology, samples: int, max_seconds: float, port: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    before = topo.counters()
    procs = []
    for r in range(topo.n):
        prefix, _ = topo.place(r)
        cmd = [*prefix, sys.executable, str(ROOT / "scripts" / "bench_ddp.py"), "--rank", str(r),
               "--workers", str(topo.n), "--samples", str(samples), "--master", f"{topo.ip[0]}:{port}",
               "--max-seconds", str(max_seconds)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=max_seconds + 900 if max_seconds else 3600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a DDP worker failed ({p.returncode}): {err[-2000:]}")
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    after = topo.counters()
    result["wire_sent"] = after[0] - before[0]
    return result


def run_p2pnode(topo: Topology, samples: int, port: int, workdir: Path, timeout: float,
                extra: list[str]) -> dict[str, Any]:
    before = topo.counters()
    r = run_variant("defaults", extra, topo.n, samples, port, workdir, timeout, place=topo.place)
    after = topo.counters()
    r["wire_sent"] = after[0] - before[0]
    return r


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| link (each node, both ways) | DDP: training time | DDP: accuracy | DDP: bytes on the wire | "
           "p2pnode: training time (slowest node) | p2pnode: accuracy min / median | p2pnode: bytes on the wire | "
           "p2pnode: exchanges (skipped) per node, median | time, DDP / p2pnode |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        d, p = row["ddp"], row["p2pnode"]
        if d is None:
            d_time = d_acc = d_full = None
        elif d["steps"] == d["of_steps"]:
            d_time, d_acc, d_full = f"{d['seconds']:.0f} s", f"{100 * d['accuracy']:.2f} %", d["seconds"]
        else:
            d_full = d["seconds"] * d["of_steps"] / max(1, d["steps"])
            d_time = f"stopped: {d['steps']}/{d['of_steps']} steps in {d['seconds']:.0f} s (full run ≈ {d_full:.0f} s)"
            d_acc = "-"
        p_acc = (f"{100 * p['min_acc']:.2f} % / {100 * p['median_acc']:.2f} %" if p["min_acc"] is not None else "-")
        p_time = p["max_train_s"]
        ratio = f"{d_full / p_time:.1f}x" if p_time and d_full else "-"
        d_bytes = f"{d['wire_sent'] / 1e9:.2f} GB" if d else "-"
        ex = statistics.median([x["exchanges"] for x in p["rows"]]) if p["rows"] else 0
        sk = statistics.median([x["skipped"] for x in p["rows"]]) if p["rows"] else 0
        out.append(f"| {row['rate']} | {d_time or '-'} | {d_acc or '-'} | {d_bytes} | "
                   f"{p_time:.0f} s | {p_acc} | {p['wire_sent'] / 1e6:.0f} MB | {ex:.0f} ({sk:.0f}) | {ratio} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", nargs="+", default=["unlimited", "1gbit", "100mbit", "25mbit"],
                    help="tc rates (e.g. 100mbit) or 'unlimited'")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--ddp-max-seconds", type=float, default=240.0,
                    help="stop DDP after this much training and report its pace (0: never)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a p2pnode setting for every node (as `p2pnode start --set`)")
    ap.add_argument("--skip-ddp", action="store_true", help="run p2pnode only")
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_thin"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_thin.py needs root (network namespaces and tc)", file=sys.stderr)
        return 2
    topo = Topology(args.nodes)
    rows = []
    try:
        topo.up()
        for rate in args.rates:
            topo.set_rate(rate)
            ddp = None
            if not args.skip_ddp:
                print(f"== {rate}: DDP", flush=True)
                ddp = run_ddp(topo, args.samples, args.ddp_max_seconds, 29533)
                print(json.dumps(ddp), flush=True)
            print(f"== {rate}: p2pnode {' '.join(args.set) or 'defaults'}", flush=True)
            extra = [a for kv in args.set for a in ("--set", kv)]
            p2p = run_p2pnode(topo, args.samples, 7571, Path(args.workdir) / rate, args.timeout, extra)
            print(json.dumps({k: v for k, v in p2p.items() if k != "rows"}), flush=True)
            rows.append({"rate": rate, "ddp": ddp, "p2pnode": p2p})
    finally:
        topo.down()
    text = table(rows)
    print(text)
    section = (f"## Thin links: p2pnode and DDP on the same slow network\n\n"
               f"{args.nodes} workers, each in its own network namespace on a bridge, its veth limited "
               f"both ways by `tc tbf` to the rate shown (no added latency: this kernel has no netem). "
               f"Same model, shards and {args.samples} samples per worker as above; DDP over gloo, then "
               f"the p2pnode defaults, on the same links one after the other. Bytes on the wire: the veth "
               f"counters (TCP/IP headers, HTTP and membership included) for all nodes together.\n\n"
               f"```\nsudo .venv/bin/python scripts/bench_thin.py --rates {' '.join(args.rates)} "
               f"--ddp-max-seconds {args.ddp_max_seconds:g}\n```\n\n"
               f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {os.cpu_count()} CPUs, "
               f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f} at the end"
               f"\n\n{text}\n")
    if not args.no_write and (args.set or args.skip_ddp):
        print("not written to docs/BENCHMARKS.md: that table is DDP against the defaults", file=sys.stderr)
    elif not args.no_write:
        write_section(section, "## Thin links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
