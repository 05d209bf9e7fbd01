"""The synchronous mode (exchange.sync = "powersgd") at GPT-2 small's size: what a worker's
PowerSGD factors and the reducer's rounds cost in time and memory at 124M parameters.

In one process, no network: the worker's side (``PowerSync`` on the named parameters of a
GPT-2-small-shaped model, ``examples/gpt2`` with GPT-2's 50257 tokens and 1024 positions: 124M
parameters) and the reducer's (``Reducer`` answering ``--nodes`` contributors' phases on an
asyncio loop, with the daemon's loop-lag probe running beside it). Per phase: seconds (median of
``--rounds``), bytes on the wire per node, and memory: the worker's error feedback and Q
factors (tensor bytes), the reducer's peak of traced allocations (tracemalloc: numpy's arrays
included) per round and for the models' mean after training (phase 2, float32 models whole).
Anchor in the same run: the float32 model's bytes, the size DDP's all-reduce moves per step.

    nice -n 5 .venv/bin/python scripts/bench_sync_size.py [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from benchlib.results import add_output_args, command_line, machine, table, write_section  # noqa: E402
from p2pnode.daemon.looplag import LoopLag  # noqa: E402
from p2pnode.daemon.metrics import NodeMetrics  # noqa: E402
from p2pnode.sync.messages import FINAL, FINAL_ROUND  # noqa: E402
try:  # the worker's PowerSGD module (renamed worker_powersgd with the modes' split)
    from p2pnode.sync.worker_powersgd import PowerSync, to_wire  # noqa: E402
except ImportError:
    from p2pnode.sync.powersgd import PowerSync, to_wire  # type: ignore[no-redef]  # noqa: E402
from p2pnode.sync.reducer import Reducer  # noqa: E402

SECTION = "## The synchronous mode at 124M parameters: PowerSGD's factors and the reducer"


def gpt2_small() -> torch.nn.Module:
    try:
        from p2pnode_gpt2 import GPT
    except ImportError:
        sys.exit("needs the example package: pip install -e examples/gpt2 (scripts/setup.sh does)")
    torch.manual_seed(0)
    return GPT(50257, 1024, 768, 12, 12)


async def reduce_rounds(nodes: int, data0: bytes, data1: bytes, final: bytes, rounds: int,
                        values: str) -> dict[str, Any]:
    names = [f"node{i:02d}" for i in range(nodes)]
    red = Reducer(60.0, lambda: set(names), final_wait=60.0, me=names[0], values=values, outlier=20.0)
    m = NodeMetrics(CollectorRegistry())
    lag = LoopLag(m.loop_lag, m.loop_lag_max, interval=0.01)
    probe = asyncio.create_task(lag.run())
    await asyncio.sleep(0.05)
    t0, t1, peaks = [], [], []
    q = -1
    for _ in range(rounds):
        gc.collect()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        began = time.perf_counter()
        outs = await asyncio.gather(*(red.contribute(n, 0, q, data0) for n in names))
        t0.append(time.perf_counter() - began)
        rnd = outs[0].round
        began = time.perf_counter()
        outs = await asyncio.gather(*(red.contribute(n, 1, rnd, data1) for n in names))
        t1.append(time.perf_counter() - began)
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
        q = rnd
    lag_rounds = lag.longest
    gc.collect()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    began = time.perf_counter()
    outs = await asyncio.gather(*(red.contribute(n, FINAL, FINAL_ROUND, final) for n in names))
    tf = time.perf_counter() - began
    peak_final = tracemalloc.get_traced_memory()[1] - base
    probe.cancel()
    return {"phase0_s": statistics.median(t0), "phase1_s": statistics.median(t1), "round_peak": max(peaks),
            "final_s": tf, "final_peak": peak_final, "lag_rounds_s": lag_rounds, "lag_final_s": lag.longest,
            "final_ok": all(o.count == nodes for o in outs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rank", type=int, default=24, help="exchange.sync_rank")
    ap.add_argument("--values", default="int4", help="exchange.sync_values")
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = gpt2_small()
    named = [(n, p) for n, p in model.named_parameters()]
    params = sum(p.numel() for _, p in named)
    dense = 4 * params
    print(f"model: {params / 1e6:.1f}M parameters, {dense / 1e6:.0f} MB float32", flush=True)
    sync = PowerSync(named, args.rank, 0, args.values)
    state = sum(t.numel() for t in sync.err.values()) * 4 + sum(t.numel() for t in sync.q.values()) * 4
    factored = sum(1 for x in sync.layout if x.rank)
    grads = {n: torch.randn_like(p) * 1e-3 for n, p in named}
    w0, w1, wf, data0, data1 = [], [], [], b"", b""
    for _ in range(args.rounds):
        began = time.perf_counter()
        data0 = sync.phase0(grads)
        w0.append(time.perf_counter() - began)
        began = time.perf_counter()
        data1 = sync.phase1(data0)  # our own P standing in for the mean (same size, same work)
        w1.append(time.perf_counter() - began)
        began = time.perf_counter()
        sync.finish(data1, 0, True)
        wf.append(time.perf_counter() - began)
    final = to_wire([p for _, p in named], "float32")
    del grads
    gc.collect()
    tracemalloc.start()
    # phase 1's part made beforehand: the worker's work stays out of the reducer's loop
    red = asyncio.run(reduce_rounds(args.nodes, data0, data1, final, args.rounds, args.values))
    tracemalloc.stop()
    mb = 1e6
    rows = [
        ["worker: PowerSGD state (error feedback + Q)", f"{state / mb:.0f} MB ({state / dense:.2f}x the model)",
         f"{factored} of {len(sync.layout)} tensors factored at rank {args.rank}"],
        ["worker: phase 0 (P = M Q, packed)", f"{statistics.median(w0):.2f} s", f"{len(data0) / mb:.2f} MB sent"],
        ["worker: phase 1 (QR of P, Q' = Mᵀ P, packed)", f"{statistics.median(w1):.2f} s",
         f"{len(data1) / mb:.2f} MB sent"],
        ["worker: finish (mean gradient, error)", f"{statistics.median(wf):.2f} s", "-"],
        [f"reducer: phase 0, {args.nodes} nodes", f"{red['phase0_s']:.2f} s",
         f"{args.nodes * len(data0) / mb:.1f} MB in"],
        [f"reducer: phase 1, {args.nodes} nodes", f"{red['phase1_s']:.2f} s", f"{args.nodes * len(data1) / mb:.1f} MB in"],
        ["reducer: a round's peak traced memory", f"{red['round_peak'] / mb:.0f} MB", "-"],
        ["reducer: longest event-loop stall in the rounds", f"{1000 * red['lag_rounds_s']:.0f} ms", "-"],
        [f"reducer: the models' mean after training, {args.nodes} nodes", f"{red['final_s']:.2f} s",
         f"{args.nodes * len(final) / mb:.0f} MB in; all in: {red['final_ok']}"],
        ["reducer: the models' mean, peak traced memory", f"{red['final_peak'] / mb:.0f} MB "
         f"({red['final_peak'] / dense:.1f}x the model)", "-"],
        ["reducer: longest event-loop stall, the models' mean", f"{1000 * red['lag_final_s']:.0f} ms", "-"],
        ["anchor: DDP's all-reduce moves per step (float32 gradient)", f"{dense / mb:.0f} MB",
         f"{dense / max(1, len(data0) + len(data1)):.0f}x a node's factors"],
    ]
    text = table(["what", "figure", "note"], rows, "lrl")
    print(text)
    if args.write:
        write_section(f"{SECTION}\n\nGPT-2 small's shape (examples/gpt2 with 50257 tokens and 1024 positions: "
                      f"{params / 1e6:.1f}M parameters, {dense / 1e6:.0f} MB float32), exchange.sync_rank "
                      f"{args.rank}, exchange.sync_values {args.values}; the reducer answering {args.nodes} "
                      f"contributors on an asyncio loop in one process (no network), one torch thread.\n\n"
                      f"```\nnice -n 5 {command_line()}\n```\n\n- {machine()}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
