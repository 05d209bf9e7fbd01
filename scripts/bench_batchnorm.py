"""BatchNorm after averaging: three real daemons train torchvision's ShuffleNet (BatchNorm in
every block) on an image-folder task, with and without the statistics recomputed before each
evaluation (``training.bn_refresh``), and one daemon alone on all the data for reference.

The data: benchlib.testdata.write_image_folders (noise with a red, green or blue square; 90
training and 30 test images a class), or with ``--data fashion`` write_fashion_folders (300
training and 100 test images of each Fashion-MNIST class); each node of three holds a third of
the training images.
Printed per variant and run: each node's evaluations (every 20 steps and the one at the end of
training), in gossip the agreed model's after the consensus finish, its training loss (the
worker's moving average) and its test loss at the end. The three-node rows
also show what the default sparse publish costs such a model, against dense float32 copies.

    .venv/bin/python scripts/bench_batchnorm.py [--variants refresh no-refresh ...] [--repeat N] [--write] [--jsonl F]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchlib.cluster import NodeProc
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section
from benchlib.status import wait_for
from benchlib.testdata import write_fashion_folders, write_image_folders

SECTION = "## BatchNorm after averaging"
#: training steps of every node (--steps)
STEPS = 180

#: name -> (nodes, --set options beyond COMMON)
VARIANTS: dict[str, tuple[int, list[str]]] = {
    "alone": (1, []),
    "refresh": (3, []),  # the defaults: training.bn_refresh = 16
    "no-refresh": (3, ["training.bn_refresh=0"]),
    "dense-refresh": (3, ["compression.publish=topk:density=1.0", "compression.value_dtype=float32"]),
    # which half of "dense" matters: the density, or float32 values instead of int8
    "f32-refresh": (3, ["compression.value_dtype=float32"]),
    "dense-int8-refresh": (3, ["compression.publish=topk:density=1.0"]),
    "d0.3-refresh": (3, ["compression.publish=topk:density=0.3"]),
    "dense-no-refresh": (3, ["compression.publish=topk:density=1.0", "compression.value_dtype=float32",
                             "training.bn_refresh=0"]),
    "lr0.1-refresh": (3, ["training.lr=0.1", "training.lr_schedule=constant"]),
    "lr0.1-no-refresh": (3, ["training.lr=0.1", "training.lr_schedule=constant", "training.bn_refresh=0"]),
    # the synchronous mode: every node steps along the mean gradient (no public copies, no lag)
    "sync": (3, ["exchange.sync=powersgd", "training.min_peers=2"]),
    # label skew: each node's refreshed statistics are of its own classes
    "skew-refresh": (3, ["training.lr=0.1", "training.lr_schedule=constant", "training.partition=dirichlet:alpha=0.3"]),
    "skew-no-refresh": (3, ["training.lr=0.1", "training.lr_schedule=constant",
                            "training.partition=dirichlet:alpha=0.3", "training.bn_refresh=0"]),
}


def common(photos: Path, steps: int = STEPS) -> list[str]:
    return ["training.task=imagefolder", f"task.root={photos}", "task.model=shufflenet_v2_x0_5",
            "task.image_size=32", "task.augment=false", "training.device=cpu", "training.batch_size=16",
            "training.lr=0.03", "training.lr_schedule=cosine", "training.warmup_samples=0",
            f"training.max_samples={16 * steps}", "training.eval_every=20", "training.eval_samples=0",
            "exchange.timeout=1.0", "membership.gossip_interval=0.3", "membership.timeout=0.5"]


def run(name: str, photos: Path, work: Path, steps: int = STEPS) -> dict[str, Any]:
    n, sets = VARIANTS[name]
    opts = [*common(photos, steps), *sets]

    def args(i: int) -> list[str]:
        return [x for s in opts for x in ("--set", s)] + ["--shard", f"{i}/{n}"]

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    nodes = [NodeProc(work, "n0", args(0)).start()]
    nodes += [NodeProc(work, f"n{i}", args(i), [nodes[0].addr]).start() for i in range(1, n)]
    try:
        for node in nodes:
            node.wait_ready(120)
        for node in nodes:
            wait_for(lambda node=node: (t := node.status()["training"])["done"] and t["eval_step"] >= steps,
                     600, f"{node.name} to finish")
        if n > 1 and not any(s.startswith("exchange.sync=") for s in sets):
            # gossip: the consensus finish, then the agreed model's evaluation (the figure at the
            # end of training is of each node's model before the finish's averages)
            for node in nodes:
                wait_for(lambda node=node: node.status()["training"]["eval_consensus"], 180,
                         f"{node.name} to evaluate the agreed model")
        rows = []
        for node in nodes:
            s = node.status()
            t = s["training"]
            lines = [line for line in node.log().splitlines() if "test accuracy" in line]
            evals = [float(line.split("accuracy")[1].split()[0]) for line in lines if "agreed on" not in line]
            rows.append({"node": node.name, "evals": evals, "end": evals[-1], "final": t["accuracy"],
                         "agreed": t["eval_consensus"], "loss": t["loss"], "test_loss": t.get("test_loss"),
                         "received": s["bytes"].get("model_received", 0)})
    finally:
        for node in nodes:
            node.stop()
    return {"variant": name, "nodes": n, "sets": sets, "rows": rows}


def fmt(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["alone", "no-refresh", "refresh", "dense-no-refresh",
                                                      "dense-refresh"], choices=list(VARIANTS))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--steps", type=int, default=STEPS, help="training steps of 16 images each node takes")
    ap.add_argument("--data", choices=("squares", "fashion"), default="squares",
                    help="squares: 3 classes of coloured squares in noise, 90 training images each (the "
                         "image-folder test's data); fashion: Fashion-MNIST, 300 training and 100 test "
                         "images of each of its 10 classes")
    ap.add_argument("--workdir", type=Path, default=None, help="where the nodes' state goes (default: a temp dir)")
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    base = args.workdir or Path(tempfile.mkdtemp(prefix="bench-bn-"))
    photos = base / ("photos" if args.data == "squares" else "fashion")
    if not photos.exists():
        if args.data == "squares":
            write_image_folders(photos, 90, 30)
        else:
            write_fashion_folders(photos, 300, 100)
    out = []
    for r in range(args.repeat):
        for name in args.variants:
            res = run(name, photos, base / f"{name}-{r}", args.steps)
            res["repeat"] = r
            append_jsonl(args.jsonl, res)
            out.append(res)
            finals = [row["final"] for row in res["rows"]]
            print(f"{name} (run {r}): end of training {[row['end'] for row in res['rows']]}, final {finals}, "
                  f"training loss {[round(x['loss'], 3) for x in res['rows']]}", flush=True)
    lines = []
    for res in out:
        rows = res["rows"]
        lines.append([f"{res['variant']} ({res['nodes']} node{'s' * (res['nodes'] > 1)})", res["repeat"],
                      " / ".join(fmt(r["end"]) for r in rows),
                      " / ".join(fmt(r["final"]) for r in rows) if rows[0]["agreed"] else "–",
                      " ".join(fmt(v) for v in rows[0]["evals"][:-1]),
                      " / ".join(fmt(r["loss"]) for r in rows), " / ".join(fmt(r["test_loss"]) for r in rows),
                      fmt(statistics.median(r["final"] for r in rows)),
                      f"{sum(r['received'] for r in rows) / 1e6:.0f}"])
    text = table(["variant", "run", "end of training, each node", "agreed model (consensus finish), each node",
                  f"first node's evaluations, steps 20–{args.steps}", "training loss", "test loss", "median",
                  "model MB received, all nodes"], lines, "llrrlrrrr")
    settings = " ".join(f"--set {s}" for s in common(Path("PHOTOS"), args.steps))
    section = (f"{SECTION}\n\n`{command_line()}`; {machine()}.\n\nEvery variant: {settings}; "
               + "; ".join(f"`{k}`: {' '.join(v[1]) or 'nothing more'}" for k, v in VARIANTS.items()
                           if k in args.variants) + ".\n\n" + text + "\n")
    print(section)
    if args.write:
        write_section(section)


if __name__ == "__main__":
    main()
