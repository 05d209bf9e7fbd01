#!/usr/bin/env python3
"""One member of four serves a poisoned model: where do the three honest nodes end, with robust
averaging (``exchange.robust = "clip"``, the default) and without (``"none"``)?

4 real nodes train the small CNN on Fashion-MNIST (IID shards, cosine schedule), as in
scripts/bench_scenarios.py. Node 3 is an ordinary node, but its peers reach it through a proxy
(``benchlib/poison.py``, it is advertised at the proxy's address) that answers every model
request with a poisoned full model made from node 3's real one: ``sign-flip`` (−x), ``scale100``
(100·x) or ``random`` (noise with each tensor's RMS). ``none`` is the attack-free run with the
same settings. Reported per run: the honest nodes' final accuracy on the 10 000 test images
(min / median / max), its change against the attack-free run of the same rule, how many of the
honest nodes' exchanges were clipped, and the training time.

Every run: ``exchange.consensus_tolerance = 0`` (no consensus finish: without clipping the honest
nodes could never agree with a poisoned peer, and would wait for it forever) and
``membership.bootstrap_from_peer = false`` (the nodes start together from the same seed; a
fresh node's bootstrap adopts a peer's model whole, unclipped: docs/ALGORITHMS.md).

    .venv/bin/python scripts/bench_poison.py                            # 8 runs, ~20 min on 2 busy cores
    .venv/bin/python scripts/bench_poison.py --robust clip --attacks none sign-flip --samples 10000
    .venv/bin/python scripts/bench_poison.py --write                    # + docs/BENCHMARKS.md

``--sync-outlier`` runs the synchronous mode instead (``exchange.sync = "powersgd"``, int4 factors at
rank 24, ``training.min_peers = 3``), once for each ``exchange.sync_outlier`` given and each
``--sync-attacks`` scale: node 3's worker sends each contribution to a step's mean times the
scale (``benchlib/sync_attack``; 1: honest). Every node ends with the models' mean, so all four
are reported.

    .venv/bin/python scripts/bench_poison.py --sync-outlier 8 0 --sync-attacks 1 -100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib.cluster import ROOT
from benchlib.poison import ATTACKS, SETTINGS, train_attacked, train_sync_attacked
from benchlib.results import (
    add_output_args,
    append_jsonl,
    command_line,
    machine,
    table,
    write_section,
)

SECTION = "## Poisoned models: one member of four attacking (robust averaging)"
SYNC_SECTION = "## The synchronous mode with one hostile member (`exchange.sync_outlier`)"


def run_one(rule: str, attack: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One training run; the honest nodes' figures."""
    attacker = args.nodes - 1
    radii: list[float] = []

    def watch(elapsed: float, statuses: list[dict[str, Any] | None]) -> None:
        for s in statuses[:attacker]:
            r = (s or {}).get("robust", {}).get("radius")
            if r is not None:
                radii.append(r)

    extra = ["--set", f"exchange.robust={rule}"]
    res, poisoned = train_attacked(f"{rule}-{attack}", workdir, args.nodes, args.samples, attack, extra, args.port,
                                   args.timeout, progress=watch)
    honest = [r for r in res.rows if r.node != attacker]
    accs = [r.accuracy for r in honest if r.accuracy is not None]
    out = {"rule": rule, "attack": attack, "honest_accs": accs,
           "clipped": sum(r.clipped for r in honest), "outliers": sum(r.outliers for r in honest),
           "exchanges": sum(r.exchanges for r in honest),
           "train_s": max((r.train_seconds for r in honest if r.train_seconds is not None), default=None),
           "poisoned_served": poisoned, "radius_median": statistics.median(radii) if radii else None,
           "settings": [*SETTINGS, *extra]}
    append_jsonl(args.jsonl, {"bench": "poison", **out, **res.to_json()})
    return out


#: the synchronous mode's settings (scripts/bench_scenarios.py's sync24-i4)
SYNC = ["--set", "exchange.sync=powersgd", "--set", "exchange.sync_rank=24", "--set", "exchange.sync_values=int4",
        "--set", "training.min_peers=3"]


def run_sync(threshold: str, scale: float, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One synchronous run, node 3's contributions times ``scale``; every node's figures."""
    extra = [*SYNC, "--set", f"exchange.sync_outlier={threshold}"]
    res = train_sync_attacked(f"sync-{threshold}-{scale:g}", workdir, args.nodes, args.samples, scale, extra,
                              args.port, args.timeout)
    out = {"sync_outlier": threshold, "scale": scale, "accs": res.accuracies,
           "outliers": sum(r.sync_outliers for r in res.rows),
           "largest_distance": max((r.sync_largest_distance for r in res.rows), default=0.0),
           "train_s": res.max_train_s, "settings": extra}
    append_jsonl(args.jsonl, {"bench": "poison-sync", **out, **res.to_json()})
    return out


def sync_cells(r: dict[str, Any]) -> list[str]:
    accs = sorted(r["accs"])
    shown = " / ".join(f"{100 * a:.2f}" for a in (accs[0], statistics.median(accs), accs[-1])) if accs else "-"
    return [r["sync_outlier"], "honest" if r["scale"] == 1 else f"its contributions x {r['scale']:g}", shown,
            str(r["outliers"]), f"{r['largest_distance']:.2f}", f"{r['train_s']:.0f} s" if r["train_s"] else "-"]


def run_all(rules: list[Any], attacks: list[Any], run: Callable[[Any, Any], dict[str, Any]]) -> list[dict[str, Any]]:
    """``run(rule, attack)`` for every pair, in order, each result printed as it comes."""
    results = []
    for rule in rules:
        for attack in attacks:
            print(f"== {rule} {attack}", flush=True)
            results.append(run(rule, attack))
            print(json.dumps(results[-1]), flush=True)
    return results


def main_sync(args: argparse.Namespace) -> int:
    results = run_all(args.sync_outlier, args.sync_attacks, lambda t, s: run_sync(t, s, args, Path(args.workdir)))
    header = ["exchange.sync_outlier", "node 3", "every node's accuracy % min / median / max",
              "outliers replaced", "largest distance (median distances)", "training time"]
    text = table(header, [sync_cells(r) for r in results], "llrrrr")
    print(text)
    if args.write:
        write_section(f"{SYNC_SECTION}\n\n{args.nodes} nodes, small CNN, Fashion-MNIST, IID shards, {args.samples} "
                      "samples per node, cosine schedule, the synchronous mode (`" + " ".join(SYNC) + "`); node 3's "
                      "worker sends each contribution times the scale shown (benchlib/sync_attack). Accuracy: every "
                      "node's final checkpoint on the 10 000 test images (all end with the models' mean). Largest "
                      "distance: of a contribution from its phase's coordinate-wise median, in median distances, as "
                      "the reducer saw it (0: not measured, the check off)."
                      f"\n\n```\n{command_line()}\n```\n\n- {machine()}\n\n{text}\n")
    return 0


def cells(r: dict[str, Any], base: dict[str, float]) -> list[str]:
    accs = sorted(r["honest_accs"])
    if len(accs) == 0:
        return [r["rule"], r["attack"], "-", "-", "-", "-", "-"]
    med = statistics.median(accs)
    delta = f"{100 * (med - base[r['rule']]):+.2f}" if r["rule"] in base and r["attack"] != "none" else ""
    radius = f"{r['radius_median']:.3f}" if r["radius_median"] is not None else "-"
    return [r["rule"], r["attack"], " / ".join(f"{100 * a:.2f}" for a in (accs[0], med, accs[-1])), delta,
            f"{r['clipped']} / {r['outliers']} / {r['exchanges']}", radius, f"{r['train_s']:.0f} s" if r["train_s"] else "-"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--robust", nargs="+", default=["clip", "none"], choices=["clip", "none"])
    ap.add_argument("--attacks", nargs="+", default=["none", *ATTACKS], choices=["none", *ATTACKS])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000, help="training samples per node")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--port", type=int, default=7611)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_poison"))
    ap.add_argument("--sync-outlier", nargs="+", default=[], metavar="THRESHOLD",
                    help="run the synchronous mode instead, with each exchange.sync_outlier given (0: off)")
    ap.add_argument("--sync-attacks", nargs="+", type=float, default=[1.0, -100.0], metavar="SCALE",
                    help="with --sync-outlier: node 3's contributions times each of these (1: honest)")
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    if args.sync_outlier:
        return main_sync(args)
    results = run_all(args.robust, args.attacks, lambda rule, attack: run_one(rule, attack, args, Path(args.workdir)))
    base = {r["rule"]: statistics.median(r["honest_accs"]) for r in results
            if r["attack"] == "none" and r["honest_accs"]}
    header = ["exchange.robust", "node 3 serves", "honest nodes' accuracy % min / median / max",
              "median vs no attack (pt)", "clipped / refused / averaged (honest nodes)", "radius tau (median)", "training time"]
    text = table(header, [cells(r, base) for r in results], "llrrrrr")
    print(text)
    if args.write:
        write_section(f"{SECTION}\n\n{args.nodes} nodes, small CNN, Fashion-MNIST, IID shards, {args.samples} samples "
                      "per node, cosine schedule; node 3 reached through a proxy that serves a poisoned full model "
                      "(benchlib/poison.py); settings: `" + " ".join(SETTINGS) + "`. Accuracy: the honest nodes' "
                      "final checkpoints on the 10 000 test images. tau: relative to ||x||, sampled once a second "
                      f"on the honest nodes.\n\n```\n{command_line()}\n```\n\n- {machine()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
