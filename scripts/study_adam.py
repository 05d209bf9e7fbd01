"""A study, not a benchmark: n nodes of a task in one process, in lockstep, through the
worker's own parts (ShardTrainer, DeltaPublisher's public copies as the wire leaves them,
average_into, the robust radius), each fetch answered by a publish (publish on fetch), one peer
of the exponential graph every ``--every`` steps. To tell quickly, on one core, why averaging
and an adaptive optimizer (AdamW) mix badly, and what mends it, before the daemons.

    .venv/bin/python scripts/study_adam.py --seeds 0 1 2 --variants base dense every1
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from benchlib.taskref import alone, reference
from p2pnode.compression.registry import build_sparsifier
from p2pnode.config import Config
from p2pnode.wire.payload import ModelSpec
from p2pnode.worker.averaging import average_into, relative_distance
from p2pnode.worker.outer import OuterNesterov
from p2pnode.worker.public import DeltaPublisher, floating_state
from p2pnode.worker.robust import make_clipper
from p2pnode.worker.training import ShardTrainer

torch.set_num_threads(1)

#: variant -> (training settings, options)
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "every1": {"every": 1},
    "dense": {"density": 1.0},
    "dense-f32": {"density": 1.0, "dtype": "float32"},
    "d03": {"density": 0.3},
    "noclip": {"robust": "none"},
    "reset": {"reset": True},
    "avgmom": {"avg_moments": True},
    "lr1.5": {"lr_mult": 1.5},
    "lr1.73": {"lr_mult": 3 ** 0.5},
    "lr2": {"lr_mult": 2.0},
    "lr3": {"lr_mult": 3.0},
    "every1-lr1.73": {"every": 1, "lr_mult": 3 ** 0.5},
    "every2": {"every": 2},
    "diloco4": {"outer": True, "robust": "none"},
    "diloco16": {"outer": True, "robust": "none", "every": 16},
    "diloco4-avg": {"outer": True, "robust": "none", "outer_lr": 1.0, "outer_mom": 0.0},
    "allmean1": {"allmean": True, "every": 1},
    "allmean1-sgd": {"allmean": True, "every": 1, "optimizer": "sgd"},
    "allmean4": {"allmean": True, "every": 4},
    "fanall": {"fanall": True},
    "fanall2": {"fanall": True, "every": 2},
    "fanall-dense": {"fanall": True, "density": 1.0},
    "fanall-f32": {"fanall": True, "density": 1.0, "dtype": "float32"},
    "mdamp": {"m_damp": True},
    "sgd": {"optimizer": "sgd"},
    "sgd-dense": {"optimizer": "sgd", "density": 1.0},
}


def run(task: dict[str, Any], settings: dict[str, Any], nodes: int, samples: int, opt: dict[str, Any]) -> list[float]:
    every = opt.get("every", 4)
    density = opt.get("density", 0.1)
    spars = build_sparsifier(f"topk:density={density}")
    trainers, pubs, clippers = [], [], []
    for i in range(nodes):
        cfg = Config.from_dict({"training": {"eval_every": 0, **settings, "shard": f"{i}/{nodes}", "max_samples": samples},
                                "task": dict(task)})
        t = ShardTrainer(cfg)
        spec = ModelSpec.from_state_dict(floating_state(t.model), t.fingerprint)
        trainers.append(t)
        pubs.append(DeltaPublisher(t.model, spec, spars, f"n{i}", "e", 0, opt.get("dtype", "int8")))
        clippers.append(make_clipper(opt.get("robust", "clip"), 3.0, 0.25, 4.0))
    outers = [OuterNesterov(t.model, opt.get("outer_lr", 0.7), opt.get("outer_mom", 0.9)) if opt.get("outer") else None
              for t in trainers]
    step = 0
    while not all(t.done for t in trainers):
        for t in trainers:
            if not t.done:
                t.train_step()
        step += 1
        if step % every:
            continue
        rnd = step // every
        if opt.get("allmean"):  # the exact mean of every node's model: an all-reduce of models
            with torch.no_grad():
                for ps in zip(*(t.model.parameters() for t in trainers)):
                    m = torch.stack([p for p in ps]).mean(0)
                    for p in ps:
                        p.copy_(m)
            continue
        if opt.get("fanall"):  # every other node's public copy, one after another: their mean
            for p in pubs:
                p.publish(0, 0.0)
            for i, t in enumerate(trainers):
                for nth, j in enumerate(k for k in range(nodes) if k != i):
                    average_into(t.model, dict(pubs[j].xhat.items()), 1.0 / (nth + 2))
            continue
        for i, t in enumerate(trainers):
            off = 1 << (rnd % max(1, (nodes - 1).bit_length()))
            j = (i + off) % nodes
            if j == i:
                j = (i + 1) % nodes
            peer = pubs[j]
            peer.publish(trainers[j].step, 0.0)
            tensors = {k: v for k, v in peer.xhat.items()}
            d = relative_distance(t.model, tensors)
            w = 0.5
            c = clippers[i]
            if c is not None:
                dec = c.decide(f"n{j}", d)
                if dec.refused:
                    continue
                w *= dec.scale
            average_into(t.model, tensors, w)
            if outers[i] is not None:
                outers[i].step(t.model)
            if opt.get("m_damp"):  # our own first moment scaled by what the average kept of our model
                for p in t.model.parameters():
                    st = t.optimizer.state.get(p)
                    if st and "exp_avg" in st:
                        st["exp_avg"].mul_(1 - w)
            if opt.get("reset"):
                t.optimizer.state.clear()
            if opt.get("avg_moments"):
                # each node's Adam moments averaged with the peer's (dense, not on the wire): the upper bound
                o = trainers[j].optimizer
                for pa, pb in zip(t.model.parameters(), trainers[j].model.parameters()):
                    sa, sb = t.optimizer.state.get(pa), o.state.get(pb)
                    if sa and sb and "exp_avg" in sa:
                        sa["exp_avg"].mul_(0.5).add_(sb["exp_avg"], alpha=0.5)
                        sa["exp_avg_sq"].mul_(0.5).add_(sb["exp_avg_sq"], alpha=0.5)
    out = []
    mean = [torch.stack([p.detach() for p in ps]).mean(0) for ps in zip(*(t.model.parameters() for t in trainers))]
    for t in trainers:
        t.evaluate(0)
        out.append(t.metrics.get("r2", t.metrics.get("accuracy", float("nan"))))
    with torch.no_grad():  # the nodes' mean model (what a consensus finish tends to), last
        for p, m in zip(trainers[0].model.parameters(), mean):
            p.copy_(m)
    trainers[0].evaluate(0)
    out.append(trainers[0].metrics.get("r2", float("nan")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variants", nargs="+", default=["base"])
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--samples", type=int, default=24000)
    ap.add_argument("--anchors", action="store_true", help="also the all-reduce reference and a node alone")
    a = ap.parse_args()
    for seed in a.seeds:
        for v in a.variants:
            opt = VARIANTS[v]
            task = {"optimizer": opt.get("optimizer", "adamw")}
            lr = a.lr if task["optimizer"] == "adamw" else 0.05
            settings = {"task": "benchlib.tasks.regression:task", "lr": lr * opt.get("lr_mult", 1.0), "seed": seed,
                        "device": "cpu"}
            t0 = time.time()
            r = run(task, settings, a.nodes, a.samples, opt)
            print(json.dumps({"seed": seed, "variant": v, "r2": [round(x, 4) for x in r],
                              "mean": round(statistics.mean(r), 4), "s": round(time.time() - t0, 1)}), flush=True)
        if a.anchors:
            for opt_name in sorted({VARIANTS[v].get("optimizer", "adamw") for v in a.variants}):
                lr = a.lr if opt_name == "adamw" else 0.05
                settings = {"task": "benchlib.tasks.regression:task", "lr": lr, "seed": seed, "device": "cpu"}
                print(json.dumps({"seed": seed, "variant": f"reference-{opt_name}",
                                  "r2": round(reference(settings, {"optimizer": opt_name}, a.nodes, a.samples)["r2"], 4)}))
                print(json.dumps({"seed": seed, "variant": f"alone-{opt_name}",
                                  "r2": round(alone(settings, {"optimizer": opt_name}, a.nodes, a.samples)["r2"], 4)}), flush=True)


if __name__ == "__main__":
    main()
