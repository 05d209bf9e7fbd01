"""Final table of a demo run: each node's checkpoint evaluated on the whole test set, with the
training and traffic figures from its last status."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchlib.cluster import checkpoint_accuracies


def traffic(b: dict[str, int]) -> tuple[int, int]:
    """A node's model bytes sent and received, whatever its mode: status's totals (gossip's
    served and fetched models, the synchronous mode's contributions and means, a parameter
    server's pushes and pulls); gossip's two alone from a node that predates them."""
    return b.get("sent", b.get("model_served", 0)), b.get("received", b.get("model_received", 0))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("state_dirs", nargs="+")
    ap.add_argument("--status", required=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    status = json.loads(Path(args.status).read_text())
    by_dir = {}
    for s in status["nodes"].values():
        if s:
            by_dir[s["node_id"]] = s
    dirs = [Path(d) for d in args.state_dirs]
    rows = []
    for d, acc in zip(dirs, checkpoint_accuracies(dirs)):
        ident = json.loads((d / "identity.json").read_text())
        rows.append((d.name, acc, by_dir.get(ident["node_id"], {})))
    print(f"\nwall time {status['elapsed_s']:.0f} s (start-up included; 'train s' is first step to last)")
    head = (f"{'node':<7} {'test acc':>8} {'steps':>6} {'samples':>8} {'train s':>8} {'sent MB':>8} {'recv MB':>8} "
            f"{'exch done':>9} {'skipped':>8}")
    print(head)
    print("-" * len(head))
    total_bytes = 0
    for name, acc, s in rows:
        t, ex, b = s.get("training", {}), s.get("exchanges", {}), s.get("bytes", {})
        sent, recv = traffic(b)
        total_bytes += recv
        accs = "-" if acc is None else f"{100 * acc:7.2f}%"
        secs = t.get("train_seconds")
        train_s = "-" if secs is None else f"{secs:.0f}"
        print(f"{name:<7} {accs:>8} {t.get('step', 0):>6} {t.get('samples', 0):>8} {train_s:>8} {sent / 1e6:>8.1f} "
              f"{recv / 1e6:>8.1f} {ex.get('done', 0):>9} {ex.get('skipped', 0):>8}")
    print(f"model bytes moved in all: {total_bytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
