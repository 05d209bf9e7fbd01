"""Live progress of a local cluster: one line per node, until every node is done training.

Writes the last status of every node to --out for the final report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from benchlib.cluster import finished
from benchlib.status import fetch_status


def line(addr: str, s: dict[str, Any] | None) -> str:
    if s is None:
        return f"  {addr:<16} (starting)"
    t, ex, b = s["training"], s["exchanges"], s["bytes"]
    alive = sum(1 for m in s["members"] if m["state"] == "alive") - 1
    loss = "-" if t["loss"] is None else f"{t['loss']:.3f}"
    return (f"  {addr:<16} step {t['step']:>5}  loss {loss:>6}  peers {alive}  exchanges {ex['done']:>5} "
            f"(skipped {ex['skipped']})  in {b['model_received'] / 1e6:7.1f} MB  out {b['model_served'] / 1e6:7.1f} MB"
            f"{'  done' if t['done'] else ''}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("addrs", nargs="+")
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    start = time.monotonic()
    tty = sys.stdout.isatty()
    last: dict[str, dict[str, Any] | None] = {a: None for a in args.addrs}
    printed = 0
    next_plain = 0.0
    while True:
        for a in args.addrs:
            last[a] = fetch_status(a) or last[a]
        elapsed = time.monotonic() - start
        lines = [f"t = {elapsed:5.0f} s"] + [line(a, last[a]) for a in args.addrs]
        if tty:
            if printed:
                sys.stdout.write(f"\x1b[{printed}F")
            sys.stdout.write("".join(f"{ln}\x1b[K\n" for ln in lines))
            printed = len(lines)
        elif elapsed >= next_plain:
            print("\n".join(lines), flush=True)
            next_plain = elapsed + 10
        sys.stdout.flush()
        done = all(s is not None and finished(s) for s in last.values())
        if done or elapsed > args.timeout:
            if not tty:
                print("\n".join(lines))
            print("all nodes done training" if done else f"stopping after {args.timeout:.0f} s")
            break
        time.sleep(1.0)
    with open(args.out, "w") as fh:
        json.dump({"elapsed_s": time.monotonic() - start, "nodes": last}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
