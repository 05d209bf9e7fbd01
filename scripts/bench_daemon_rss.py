"""Resident memory of an idle daemon (the network process, not its worker): start one node with
the torch-free stub worker, wait until it is ready, read VmRSS/VmHWM of the daemon's pid, stop it.

    .venv/bin/python scripts/bench_daemon_rss.py [--src DIR] [--runs N]

``--src`` runs the p2pnode package found in DIR (e.g. a ``git worktree`` of an older commit)
instead of this checkout, to compare before and after a change.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib.procs import status_kb
from benchlib.status import free_port, get_json, wait_for


def one(src: Path) -> tuple[int, int, float]:
    """(VmRSS kB, VmHWM kB, seconds until ready) of one stub-worker daemon run from ``src``."""
    with tempfile.TemporaryDirectory() as tmp:
        addr = f"127.0.0.1:{free_port()}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(src)}
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "p2pnode", "start", "--listen", addr, "--state-dir",
                                 f"{tmp}/state", "--set", "training.worker=stub"], cwd=src, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: (s := get_json(addr))["training"]["worker_alive"] and s["joined"], 60, "ready")
            ready = time.monotonic() - t0
            time.sleep(1.0)
            return status_kb(proc.pid, "VmRSS"), status_kb(proc.pid, "VmHWM"), ready
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = [one(args.src.resolve()) for _ in range(args.runs)]
    for rss, hwm, ready in rows:
        print(f"daemon VmRSS {rss / 1024:.0f} MiB  VmHWM {hwm / 1024:.0f} MiB  ready after {ready:.1f} s")
    rss = sorted(r[0] for r in rows)[len(rows) // 2]
    print(f"median VmRSS {rss / 1024:.0f} MiB over {len(rows)} runs ({args.src})")


if __name__ == "__main__":
    main()
