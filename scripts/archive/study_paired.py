"""The per-run gaps to DDP judged image by image: is a run's gap to DDP more than the test set's
chance? (benchlib/paired.py says why and how.)

For each run (scenario, seed, partition seed) it reads three final models from folders the
benchmark left:

- DDP as shipped (its own batch order), ``bench_scenarios.py --ddp-save D``;
- DDP given the nodes' batch order (``--ddp-order p2pnode --ddp-only --ddp-save D``): DDP judged
  against itself, only the order of the same batches changed;
- p2pnode's nodes (``--workdir P/SCENARIO-seedS-pP``), the worst node of the run;

and prints, for p2pnode against DDP and for DDP against itself, the gap, the images only one of
the two gets right, the standard deviation a gap between two equally good models with that many
disagreements has (sqrt(b + c) / n), and McNemar's exact p. Run after the benchmark, e.g.:

    for R in iid:0:0 dir0.5:2:0; do IFS=: read SC S P <<< "$R"
      .venv/bin/python scripts/bench_scenarios.py --scenarios $SC --variants sync24-i4 --seed $S --partition-seed $P \\
          --ddp-save run/paired/ddp --workdir run/paired/p2p/$SC-seed$S-p$P
      .venv/bin/python scripts/bench_scenarios.py --scenarios $SC --ddp-only --ddp-order p2pnode --seed $S \\
          --partition-seed $P --ddp-save run/paired/ddp; done
    .venv/bin/python scripts/archive/study_paired.py --runs iid:0:0 dir0.5:2:0 --ddp-dir run/paired/ddp --p2p-dir run/paired/p2p
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchlib.paired import Paired, compare, correct, ddp_run_name  # noqa: E402
from benchlib.results import append_jsonl, table  # noqa: E402

#: the per-run goal for each scenario: the lowest gap to DDP (pt) a run may end at
GOALS = {"iid": -0.2, "thin25": -0.3, "dir0.5": -0.5, "dir0.1": -0.5, "classes2": -0.5}


def cells(p: Paired | None) -> list[str]:
    if p is None:
        return ["-"] * 4
    return [f"{p.gap_pt:+.2f}", f"{p.only_a} / {p.only_b}", f"{p.chance_sd_pt:.2f}", f"{p.p_value:.2f}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", required=True, metavar="SCENARIO:SEED:PARTITION_SEED")
    ap.add_argument("--ddp-dir", required=True, help="bench_scenarios.py's --ddp-save folder")
    ap.add_argument("--p2p-dir", required=True, help="the folder holding each run's --workdir (SCENARIO-seedS-pP)")
    ap.add_argument("--variant", default="sync24-i4", help="the p2pnode variant the runs ran")
    ap.add_argument("--jsonl", default="", help="append one JSON line per run here")
    args = ap.parse_args()
    rows: list[list[str]] = []
    same_rows: list[list[str]] = []  #: p2pnode against DDP on the nodes' own batches
    gaps_p2p: list[float] = []
    gaps_ddp: list[float] = []
    gaps_same: list[float] = []
    for spec in args.runs:
        sc, seed, pseed = spec.split(":")
        tag = f"{sc}-seed{seed}-p{pseed}"
        own = Path(args.ddp_dir) / ddp_run_name(sc, int(seed), int(pseed), "own") / "rank0"
        order = Path(args.ddp_dir) / ddp_run_name(sc, int(seed), int(pseed), "p2pnode") / "rank0"
        nodes = sorted((Path(args.p2p_dir) / tag / f"{sc}-{args.variant}").glob("node[0-9]*"))
        nodes = [n for n in nodes if n.is_dir()]
        if not own.is_dir() or not nodes:
            print(f"{tag}: skipped (no {own if not own.is_dir() else 'p2pnode node folders'})", file=sys.stderr)
            continue
        right = correct([own, *nodes, *([order] if order.is_dir() else [])])
        ddp, node_rights = right[0], right[1:1 + len(nodes)]
        worst = min(node_rights, key=lambda r: r.mean())
        p2p = compare(worst, ddp)
        gaps_p2p.append(p2p.gap_pt)
        self_ = same = None  # DDP in the nodes' order against DDP; p2pnode against it
        if order.is_dir():
            self_, same = compare(right[-1], ddp), compare(worst, right[-1])
            gaps_ddp.append(self_.gap_pt)
            gaps_same.append(same.gap_pt)
            same_rows.append([sc, f"{seed} / {pseed}", f"{100 * same.acc_b:.2f}", f"{100 * same.acc_a:.2f}",
                              *cells(same)])
        goal = GOALS.get(sc)
        rows.append([sc, f"{seed} / {pseed}", f"{100 * p2p.acc_b:.2f}", f"{100 * p2p.acc_a:.2f}", *cells(p2p),
                     "-" if goal is None else ("met" if p2p.gap_pt >= goal - 1e-9 else "**missed**"),
                     "-" if self_ is None else f"{100 * self_.acc_a:.2f}", *cells(self_)])
        append_jsonl(args.jsonl or None, {"study": "paired", "run": tag, "variant": args.variant,
                                          "p2p_vs_ddp": p2p.__dict__, "ddp_order_vs_ddp": self_ and self_.__dict__,
                                          "p2p_vs_ddp_order": same and same.__dict__,
                                          "node_accs": [float(r.mean()) for r in node_rights]})
    header = ["scenario", "seed / partition", "DDP %", "p2pnode worst node %", "gap (pt)", "only p2pnode / only DDP",
              "chance sd (pt)", "McNemar p", "goal", "DDP, nodes' order %", "gap (pt)", "only it / only DDP",
              "chance sd (pt)", "McNemar p"]
    print(table(header, rows, "llrrrrrrlrrrrr"))
    if same_rows:
        print("\np2pnode against DDP given the nodes' batches in the nodes' order (the same model to start, the "
              "same batches):\n")
        print(table(["scenario", "seed / partition", "DDP, nodes' order %", "p2pnode worst node %", "gap (pt)",
                     "only p2pnode / only DDP", "chance sd (pt)", "McNemar p"], same_rows, "llrrrrrr"))
    for name, g in (("p2pnode - DDP", gaps_p2p), ("DDP in the nodes' order - DDP", gaps_ddp),
                    ("p2pnode - DDP in the nodes' order", gaps_same)):
        if len(g) > 1:
            print(f"{name}: mean {statistics.mean(g):+.2f} pt, sd {statistics.stdev(g):.2f} over {len(g)} runs")
    print(json.dumps({"runs": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
