"""How far a run lands from DDP on the same seed when nothing but rounding differs: the floor
under the per-run goals of the scenario benchmarks.

Why: the scenario benchmarks ask every node to end within 0.2 pt of DDP on even shards (0.5 on skewed ones)
*in each run*, against DDP on the same shards and seed. The synchronous mode's gaps scatter
either side of zero from seed to seed (−0.56 to +0.57 over six even-shard seeds, mean −0.06).
This study asks how much of that scatter any method other than DDP itself must have: in the
lockstep study (``scripts/archive/study_skew.py``'s setup, one process), for each seed it runs

- DDP (the study's, its mean gradient clipped at 5 as the daemons' anchor is),
- the same mean gradient summed in another order (``study_sync.py --rank 0``: DDP but for a
  float32 sum's order, a change of about 1e-7 of each value),
- the daemon's synchronous mode (PowerSGD rank 6, float16 on the wire, small tensors whole),

and prints each seed's gap to DDP. Jobs already in ``--jsonl`` are not run again.

    .venv/bin/python scripts/archive/study_floor.py --seeds 0 1 2 3 4 5 6 7 --jsonl run/s32/floor.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchlib.results import table  # noqa: E402

#: the daemon's synchronous mode as it runs by default, but for the rank: int8 in blocks, each
#: node's error its own residual with its rounding owed, the small tensors whole and rounded
I8B_OWED: dict[str, object] = {"value_bits": 8, "min_compression_rate": 2.0, "round_dense": True,
                               "local_residual": True, "owe_rounding": True, "dense_feedback": True,
                               "int8_blocks": True}
#: the rows of the study: name -> (script, the options it sets, as the script's record has them)
ROWS: dict[str, tuple[str, dict[str, object]]] = {
    "ddp": ("study_skew.py", {"algo": "ddp", "ddp_clip": 5.0}),
    "sum-order": ("study_sync.py", {"rank": 0, "value_bits": 0}),
    "sync6": ("study_sync.py", {"rank": 6, "value_bits": 16, "min_compression_rate": 2.0, "round_dense": True}),
    # where sync6's own cost sits: the same factors in float32, or float16 with a power-of-two scale a tensor
    "sync6-f32": ("study_sync.py", {"rank": 6, "value_bits": 0, "min_compression_rate": 2.0}),
    "sync6-scaled": ("study_sync.py", {"rank": 6, "value_bits": 16, "min_compression_rate": 2.0, "round_dense": True,
                                       "scaled": True}),
    # how the cost falls with the rank (bytes grow with it: rank 10 is about 1/20 of DDP's)
    "sync10": ("study_sync.py", {"rank": 10, "value_bits": 16, "min_compression_rate": 2.0, "round_dense": True}),
    # each node's error its own residual out of the shared P (the same mean; a node's lean no longer piles up)
    "sync6-local": ("study_sync.py", {"rank": 6, "value_bits": 16, "min_compression_rate": 2.0, "round_dense": True,
                                      "local_residual": True}),
    # fewer bytes: lower ranks, and int8 factors (one scale a column), with each node's own residual
    "sync2": ("study_sync.py", {"rank": 2, "value_bits": 16, "min_compression_rate": 2.0, "round_dense": True}),
    "sync2-i8-local": ("study_sync.py", {"rank": 2, "value_bits": 8, "min_compression_rate": 2.0, "round_dense": True,
                                         "local_residual": True}),
    "sync6-i8-local": ("study_sync.py", {"rank": 6, "value_bits": 8, "min_compression_rate": 2.0, "round_dense": True,
                                         "local_residual": True}),
    "sync12-i8-local": ("study_sync.py", {"rank": 12, "value_bits": 8, "min_compression_rate": 2.0,
                                          "round_dense": True, "local_residual": True}),
    # the same, each node's rounding owed: of its Q' part, and of its whole tensors
    "sync12-i8-owe": ("study_sync.py", {"rank": 12, "value_bits": 8, "min_compression_rate": 2.0,
                                        "round_dense": True, "local_residual": True, "owe_rounding": True,
                                        "dense_feedback": True}),
    # int8 as the daemon's wire has it (blocks of 64 values a scale, each column its own)
    "sync12-i8b": ("study_sync.py", {"rank": 12, "value_bits": 8, "min_compression_rate": 2.0, "round_dense": True,
                                     "local_residual": True, "int8_blocks": True}),
    "sync12-i8b-owe": ("study_sync.py", {**I8B_OWED, "rank": 12}),
    # the daemon's int8 at the daemon's rank: half sync6's bytes
    "sync6-i8b-owe": ("study_sync.py", {**I8B_OWED, "rank": 6}),
    # the convolution sent whole (a matrix factored only when that divides it by 5, or by 7 at
    # rank 8): where the rank's cost sits; at rank 12 a third more bytes, at rank 8 about the same
    "sync12-i8b-owe-mc5": ("study_sync.py", {**I8B_OWED, "rank": 12, "min_compression_rate": 5.0}),
    "sync8-i8b-owe-mc7": ("study_sync.py", {**I8B_OWED, "rank": 8, "min_compression_rate": 7.0}),
    # ACP-SGD: one factor a step (one all-reduce, not two), at twice the rank for about the same bytes
    "sync24-i8b-owe-alt": ("study_sync.py", {**I8B_OWED, "rank": 24, "alternate": True}),
}
#: study_sync.py's options that make one row another, at their defaults: a record is a row's when
#: every one of them is what the row sets, or its default where the row sets none
SYNC_DEFAULTS: dict[str, object] = {"rank": 4, "value_bits": 0, "min_compression_rate": 1.0, "last_share": 1.0,
                                    "drop_last": False, "scaled": False, "round_dense": False,
                                    "dense_feedback": False, "local_residual": False,
                                    "owe_rounding": False, "int8_blocks": False, "alternate": False}


def options(opts: dict[str, object]) -> list[str]:
    """A row's options on its script's command line."""
    out: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def row_of(rec: dict) -> str | None:
    """Which of ``ROWS`` a study record is (None: another study's). study_sync.py's records say
    ``algo: powersgd``; study_skew.py keeps its algo in ``args``."""
    a = rec["args"]
    script = "study_sync.py" if rec.get("algo") == "powersgd" else "study_skew.py"
    for name, (where, opts) in ROWS.items():
        if where != script:
            continue
        want = {**SYNC_DEFAULTS, **opts} if script == "study_sync.py" else opts
        if all(a.get(k, SYNC_DEFAULTS.get(k)) == v for k, v in want.items()):
            return name
    return None


def load(path: Path) -> dict[tuple[str, int, str], float]:
    """(partition, seed, row) -> accuracy %, the partition seed equal to the seed."""
    out: dict[tuple[str, int, str], float] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        a, row = rec["args"], row_of(rec)
        if row and a["pseed"] == a["seed"] and a["samples"] == 30000 and a["nodes"] == 4:
            out[(a["partition"], a["seed"], row)] = 100 * rec["accs"][0]
    return out


def run_missing(partitions: list[str], seeds: list[int], rows: list[str], jsonl: Path, jobs: int) -> None:
    have = load(jsonl)
    todo = [[sys.executable, str(ROOT / "scripts" / "archive" / script), *options(opts), "--partition", p, "--pseed", str(s),
             "--seed", str(s), "--jsonl", str(jsonl)]
            for p in partitions for s in seeds for name in rows if (p, s, name) not in have
            for script, opts in [ROWS[name]]]
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'scripts' / 'archive'}:{ROOT}", "OMP_NUM_THREADS": "1"}
    with ThreadPoolExecutor(jobs) as pool:
        for cmd, rc in zip(todo, pool.map(lambda c: subprocess.run(c, env=env, capture_output=True).returncode, todo)):
            if rc:
                print(f"failed ({rc}): {' '.join(cmd)}", file=sys.stderr)


def report(partitions: list[str], seeds: list[int], names: list[str], jsonl: Path) -> str:
    acc = load(jsonl)
    rows, summary = [], []
    for p in partitions:
        gaps: dict[str, list[float]] = {n: [] for n in names if n != "ddp"}
        for s in seeds:
            if (p, s, "ddp") not in acc:
                continue
            d = acc[(p, s, "ddp")]
            cells = []
            for name in gaps:
                if (p, s, name) in acc:
                    gaps[name].append(acc[(p, s, name)] - d)
                    cells.append(f"{acc[(p, s, name)]:.2f} ({acc[(p, s, name)] - d:+.2f})")
                else:
                    cells.append("–")
            rows.append([p, s, f"{d:.2f}", *cells])
        for name, g in gaps.items():
            if g:
                summary.append([p, name, len(g), f"{statistics.mean(g):+.2f}",
                                f"{statistics.stdev(g):.2f}" if len(g) > 1 else "–",
                                f"{min(g):+.2f} / {max(g):+.2f}", sum(x < -0.2 for x in g), sum(x < -0.5 for x in g)])
    return "\n\n".join([
        table(["partition", "seed", "DDP %", *(f"{n} % (gap)" for n in names if n != "ddp")], rows),
        table(["partition", "row", "seeds", "mean gap", "sd", "lowest / highest", "below −0.2", "below −0.5"], summary),
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", nargs="+", default=["iid", "dirichlet:alpha=0.1"])
    ap.add_argument("--seeds", nargs="+", type=int, default=list(range(8)))
    ap.add_argument("--jsonl", type=Path, required=True, help="the study's records: read, and appended to")
    ap.add_argument("--rows", nargs="+", default=["ddp", "sum-order", "sync6"], choices=list(ROWS),
                    help="ddp: the anchor (always run); sum-order: DDP but for a float32 sum's order; sync6: the "
                         "daemon's synchronous mode; sync6-f32 / sync6-scaled: its factors in float32 / scaled float16; "
                         "sync10: rank 10; sync6-local: each node's error its own residual")
    ap.add_argument("--jobs", type=int, default=2, help="study runs at once (one core each)")
    ap.add_argument("--report-only", action="store_true", help="print the table of what --jsonl holds, run nothing")
    args = ap.parse_args()
    names = ["ddp", *(r for r in args.rows if r != "ddp")]
    if not args.report_only:
        run_missing(args.partitions, args.seeds, names, args.jsonl, args.jobs)
    print(report(args.partitions, args.seeds, names, args.jsonl))


if __name__ == "__main__":
    main()
