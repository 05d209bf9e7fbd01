#!/usr/bin/env python3
"""The small CNN's training step and evaluation forward pass on the CPU, NCHW against
channels-last activations (what ``SmallCNN.forward`` does on the CPU), side by side.

Both layouts run the same model, the same weights and the same batch, interleaved call by call
(so background load hits both alike); the table shows medians over ``--repeats`` calls, one
thread (as a node's worker runs, OMP_NUM_THREADS=1), and the largest difference between the two
layouts' logits (float rounding). NCHW is the model's own layers called on the NCHW batch,
which is what its forward did before.

    .venv/bin/python scripts/bench_layout.py            # ~1 min here
    .venv/bin/python scripts/bench_layout.py --write    # and replace its section of docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section
from p2pnode.models import SmallCNN

SECTION = "## Channels-last"


def nchw_forward(model: SmallCNN, x: torch.Tensor) -> torch.Tensor:
    """The forward pass as it was: the layers on the batch as it comes (NCHW)."""
    return model.classifier(model.features(x))


def measure(batch: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    passes: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"nchw": lambda b: nchw_forward(model, b),
                                                                  "channels_last": model}
    times: dict[str, list[float]] = {f"{k}_{what}": [] for k in passes for what in ("step", "forward")}
    for i in range(repeats + 10):  # the first 10 are a warm-up
        for name, forward in passes.items():
            start = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(forward(x), y).backward()
            opt.step()
            middle = time.perf_counter()
            with torch.no_grad():
                forward(x)
            end = time.perf_counter()
            if i >= 10:
                times[f"{name}_step"].append(middle - start)
                times[f"{name}_forward"].append(end - middle)
    with torch.no_grad():
        diff = float((nchw_forward(model, x) - model(x)).abs().max())
    return {k: statistics.median(v) * 1000 for k, v in times.items()} | {"max_logit_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--repeats", type=int, default=200)
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for batch in args.batches:
        r = measure(batch, args.repeats)
        append_jsonl(args.jsonl, {"bench": "layout", "batch": batch, **r})
        rows.append([batch, f"{r['nchw_step']:.1f}", f"{r['channels_last_step']:.1f}",
                     f"{r['nchw_step'] / r['channels_last_step']:.2f}x", f"{r['nchw_forward']:.1f}",
                     f"{r['channels_last_forward']:.1f}", f"{r['nchw_forward'] / r['channels_last_forward']:.2f}x",
                     f"{r['max_logit_diff']:.1e}"])
    text = "\n".join([
        SECTION, "", "```", command_line(), "```", "", machine(), "",
        table(["batch", "step NCHW (ms)", "step channels-last (ms)", "speed-up", "forward NCHW (ms)",
               "forward channels-last (ms)", "speed-up", "largest logit difference"], rows), "",
        "The small CNN (`p2pnode.models.SmallCNN`), one thread, medians of "
        f"{args.repeats} interleaved calls; a step is zero_grad, forward, backward and an SGD step.",
        "The model's forward pass takes the channels-last path on the CPU (since 2026-11-28; before,",
        "NCHW): only its activations change layout, its parameters keep theirs, so the wire and",
        "the checkpoints are unchanged. Both sides of every DDP comparison train this model.", ""])
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
