"""Thin links: p2pnode against PyTorch DDP when every machine has a slow network connection.

Each of the 4 workers gets its own Linux network namespace on a bridge, its veth limited both
ways by a token-bucket filter (`tc tbf`) to the given rate (benchlib.netns): every node can
upload and download at that rate, as on a LAN of ordinary machines or a thin office link (no
added latency: a link is only slow, not far). For each rate, DDP over gloo and the p2pnode
defaults run on the same topology, one after the other, on the same data and model as
scripts/bench_cluster.py and scripts/bench_ddp.py. Bytes are read from the veth counters: what
really crossed the links, headers included.

    sudo .venv/bin/python scripts/bench_thin.py [--rates unlimited 1gbit 100mbit 25mbit] [--write]

DDP on a very thin link would need many minutes: with --ddp-max-seconds it stops after that long
and its row gives the pace (steps done, and the time the full run would take at that pace) with
no accuracy. Needs root, iproute2 and the tbf qdisc.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchlib.cluster import ROOT, TrainResult, train
from benchlib.ddp import DdpRun, run_ddp
from benchlib.netns import Topology, unavailable
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section

SECTION = "## Thin links: p2pnode and DDP on the same slow network"


def ddp_cells(d: dict[str, Any] | None) -> tuple[str, str, str, float | None]:
    """(time, accuracy, bytes, full-run seconds) of a DDP run, "-" where there is none."""
    if d is None or "failed" in d:
        return "-", "-", "-", None
    if d["steps"] == d["of_steps"]:
        return f"{d['seconds']:.0f} s", f"{100 * d['accuracy']:.2f} %", f"{d['wire_sent'] / 1e9:.2f} GB", d["seconds"]
    full = d["seconds"] * d["of_steps"] / max(1, d["steps"])
    return (f"stopped: {d['steps']}/{d['of_steps']} steps in {d['seconds']:.0f} s (full run ≈ {full:.0f} s)", "-",
            f"{d['wire_sent'] / 1e9:.2f} GB", full)


def result_table(rows: list[tuple[str, dict[str, Any] | None, TrainResult]]) -> str:
    out = []
    for rate, d, p in rows:
        d_time, d_acc, d_bytes, d_full = ddp_cells(d)
        p_time = p.max_train_s
        p_acc = "-" if p.min_acc is None else f"{100 * p.min_acc:.2f} % / {100 * (p.median_acc or 0):.2f} %"
        out.append([rate, d_time, d_acc, d_bytes, f"{p_time:.0f} s" if p_time else "-", p_acc,
                    f"{p.extra['wire_sent'] / 1e6:.0f} MB", f"{p.median('exchanges'):.0f} ({p.median('skipped'):.0f})",
                    f"{d_full / p_time:.1f}x" if p_time and d_full else "-"])
    return table(["link (each node, both ways)", "DDP: training time", "DDP: accuracy", "DDP: bytes on the wire",
                  "p2pnode: training time (slowest node)", "p2pnode: accuracy min / median",
                  "p2pnode: bytes on the wire", "p2pnode: exchanges (skipped) per node, median",
                  "time, DDP / p2pnode"], out)


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
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    if reason := unavailable():
        print(f"bench_thin.py: {reason} (and tc)", file=sys.stderr)
        return 2
    if args.write and (args.set or args.skip_ddp):
        ap.error("--write: that table is DDP against the defaults (no --set, no --skip-ddp)")
    extra = [a for kv in args.set for a in ("--set", kv)]
    rows: list[tuple[str, dict[str, Any] | None, TrainResult]] = []
    with Topology(args.nodes, tag="p2pth") as topo:
        for rate in args.rates:
            topo.set_rate(rate)
            ddp = None
            if not args.skip_ddp:
                print(f"== {rate}: DDP", flush=True)
                before = topo.counters()[0]
                ddp = run_ddp(DdpRun(workers=args.nodes, samples=args.samples, max_seconds=args.ddp_max_seconds),
                              topo.place, env={"GLOO_SOCKET_IFNAME": "eth0"})
                ddp["wire_sent"] = topo.counters()[0] - before
                print(json.dumps(ddp), flush=True)
                append_jsonl(args.jsonl, {"bench": "thin", "system": "ddp", "rate": rate, **ddp})
            print(f"== {rate}: p2pnode {' '.join(args.set) or 'defaults'}", flush=True)
            before = topo.counters()[0]
            p2p = train("defaults", Path(args.workdir) / rate, args.nodes, args.samples, extra, 7571, args.timeout,
                        topo.place)
            p2p.extra["wire_sent"] = topo.counters()[0] - before
            print(json.dumps({k: v for k, v in p2p.to_json().items() if k != "rows"}), flush=True)
            append_jsonl(args.jsonl, {"bench": "thin", "system": "p2pnode", "rate": rate, **p2p.to_json()})
            rows.append((rate, ddp, p2p))
    text = result_table(rows)
    print(text)
    if args.write:
        write_section(f"{SECTION}\n\n{args.nodes} workers, each in its own network namespace on a bridge, its veth "
                      f"limited both ways by `tc tbf` to the rate shown (no added latency). Same model, shards and "
                      f"{args.samples} samples per worker as above; DDP over gloo, then the p2pnode defaults, on the "
                      f"same links one after the other. Bytes on the wire: the veth counters (TCP/IP headers, HTTP "
                      f"and membership included) for all nodes together.\n\n```\nsudo {command_line()}\n```\n\n"
                      f"- {machine()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
