"""A study, not a benchmark: the synchronous mode's all-reduce in lockstep, in one process,
through the worker's own parts (ShardTrainer, PowerSync's phases, the wire's values and the
reducer's rounding of each mean), on a task of the learning-quality suite, against the exact
mean of the nodes' gradients. No daemon, no timing: only what the compression does to an
optimizer (AdamW above all), to choose the synchronous mode's defaults before the daemons.

    .venv/bin/python scripts/study_sync_adam.py --task charlm --seeds 0 1 --variants exact default whole-i8
"""
from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np
import torch

from benchlib.tasks.ddpref import backward
from benchlib.tasks.suite import TASKS
from p2pnode.config import Config
from p2pnode.sync.values import decode, encode
from p2pnode.sync.worker_powersgd import PowerSync
from p2pnode.worker.training import ShardTrainer

torch.set_num_threads(1)

#: variant -> (rank, values, steps whole first (a fraction of training), whole tensors' values)
VARIANTS: dict[str, dict[str, Any]] = {
    "exact": {"exact": True},
    "default": {"rank": 24, "values": "int4"},
    "i8": {"rank": 24, "values": "int8"},
    "f16": {"rank": 24, "values": "float16"},
    "whole-i8": {"rank": 100000, "values": "int8"},
    "whole-i4": {"rank": 100000, "values": "int4"},
    "whole-f16": {"rank": 100000, "values": "float16"},
    "warm10": {"rank": 24, "values": "int4", "warm": 0.1},
    "warm10-i8": {"rank": 24, "values": "int4", "warm": 0.1, "warm_values": "int8"},
    "r48": {"rank": 48, "values": "int4"},
    "i8-warm10": {"rank": 24, "values": "int8", "warm": 0.1, "warm_values": "int8"},
    "i8-warm30": {"rank": 24, "values": "int8", "warm": 0.3, "warm_values": "int8"},
}


def reduce_mean(parts: list[bytes], kind: str, size: int) -> bytes:
    """What the reducer answers: the float64 sum of the parts, divided, rounded once."""
    total = np.zeros(size, dtype=np.float64)
    for p in parts:
        total += decode(p, kind, size).astype(np.float64)
    return encode(total / len(parts), kind)


def wire_size(data: bytes, kind: str) -> int:
    """How many values a part carries (int8, int4: the count in its head)."""
    if kind == "float16":
        return len(data) // 2
    return int(np.frombuffer(data[:4], dtype="<u4")[0])


def run(settings: dict[str, Any], task: dict[str, Any], nodes: int, samples: int, opt: dict[str, Any],
        metric: str) -> tuple[float, int]:
    trainers = []
    for i in range(nodes):
        cfg = Config.from_dict({"training": {"eval_every": 0, **settings, "shard": f"{i}/{nodes}", "max_samples": samples},
                                "task": dict(task)})
        trainers.append(ShardTrainer(cfg))
    named: list[tuple[str, torch.Tensor]] = [(n, p) for n, p in trainers[0].model.named_parameters()]
    seed = int(settings["seed"])
    late = [PowerSync(named, opt["rank"], seed, opt["values"]) for _ in trainers] if not opt.get("exact") else []
    early = ([PowerSync(named, 100000, seed, opt.get("warm_values", "int8")) for _ in trainers]
             if opt.get("warm") else [])
    total_steps = samples // int(settings.get("batch_size", 64))
    sent = 0
    while not trainers[0].done:
        for t in trainers:
            backward(t)
        grads = [{n: p.grad for n, p in t.model.named_parameters() if p.grad is not None} for t in trainers]
        if opt.get("exact"):
            mean = {n: torch.stack([g[n] for g in grads]).mean(0) for n in grads[0]}
            means = [mean] * nodes
        else:
            syncs = early if early and trainers[0].step <= opt["warm"] * total_steps else late
            kind = syncs[0].values
            p0 = [s.phase0(g) for s, g in zip(syncs, grads)]
            n0 = wire_size(p0[0], kind)
            m0 = reduce_mean(p0, kind, n0)
            p1 = [s.phase1(m0) for s in syncs]
            n1 = wire_size(p1[0], kind)
            m1 = reduce_mean(p1, kind, n1)
            means = [s.finish(m1, trainers[0].step, True) for s in syncs]
            sent += len(p0[0]) + len(p1[0])
        with torch.no_grad():
            for g, mean in zip(grads, means):
                for n, x in g.items():
                    x.copy_(mean[n].view_as(x))
        for t in trainers:
            t._clip_and_step()
    t = trainers[0]
    t.evaluate(0)
    return t.metrics[metric], sent // max(1, t.step)


def main() -> None:
    from p2pnode.data import default_cache_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="charlm", choices=sorted(TASKS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variants", nargs="+", default=["exact", "default"], choices=sorted(VARIANTS))
    ap.add_argument("--nodes", type=int, default=3)
    a = ap.parse_args()
    st = TASKS[a.task]
    task = {**st.task, **st.prepare(default_cache_dir())}
    for seed in a.seeds:
        settings = {**st.training, "seed": seed, "device": "cpu", "lr_schedule": "cosine", "partition": "iid"}
        for v in a.variants:
            t0 = time.time()
            value, per_step = run(settings, task, a.nodes, st.samples, VARIANTS[v], st.metric)
            print(json.dumps({"task": a.task, "seed": seed, "variant": v, st.metric: round(value, 4),
                              "bytes_a_node_step": per_step, "s": round(time.time() - t0, 1)}), flush=True)
            assert math.isfinite(value)


if __name__ == "__main__":
    main()
