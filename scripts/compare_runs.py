"""Two runs of the built-in CNN compared image by image, node by node (McNemar's exact test),
and each run's consensus finish against its best node's own model before it.

The runs are ``scripts/bench_scenarios.py`` folders (``--workdir W``: ``W/<scenario>-<variant>``,
each node's final ``checkpoint.pt`` in ``nodeI/`` and its log in ``nodeI.log``). Used for the
late-joiner runs (docs/BENCHMARKS.md, "Nodes started 30 s apart"): a staggered run against the
same seed started together.

    .venv/bin/python scripts/compare_runs.py RUN_A RUN_B [--nodes 4]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib.paired import compare, correct  # noqa: E402

#: the node's log line for an evaluation on the whole test set; "agreed on": after the finish
EVAL = re.compile(r"test accuracy ([0-9.]+) on 10000 images(, the model agreed on)?")


def own_and_agreed(log: str) -> tuple[float | None, float | None]:
    """The node's last figure for its own model, and for the model agreed at the finish."""
    own = [float(a) for a, agreed in EVAL.findall(log) if not agreed]
    agreed = [float(a) for a, ag in EVAL.findall(log) if ag]
    return (own[-1] if own else None), (agreed[-1] if agreed else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=2, type=Path)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    right = {}
    for run in args.runs:
        figures = [own_and_agreed((run / f"node{i}.log").read_text()) for i in range(args.nodes)]
        right[run] = correct([run / f"node{i}" for i in range(args.nodes)])
        finals = [100 * r.mean() for r in right[run]]
        best = 100 * max(own for own, _ in figures if own is not None)
        print(f"{run}: final {' / '.join(f'{f:.2f}' for f in finals)} %; own when training ended "
              f"{' / '.join('-' if o is None else f'{100 * o:.2f}' for o, _ in figures)}; agreed "
              f"{' / '.join('-' if a is None else f'{100 * a:.2f}' for _, a in figures)}; "
              f"final - best own {min(finals) - best:+.2f} to {max(finals) - best:+.2f} pt")
    a, b = args.runs
    for i in range(args.nodes):
        p = compare(right[a][i], right[b][i])
        print(f"node {i}: {100 * p.acc_a:.2f} against {100 * p.acc_b:.2f} %, right only in the first {p.only_a}, "
              f"only in the second {p.only_b}, McNemar p = {p.p_value:.2g}")


if __name__ == "__main__":
    main()
