"""The lockstep study with nodes *out of step*, as the daemons run: does that cost what the
daemons lose against the study?

The daemons' nodes are 10–30 steps apart at any moment (their histories in the scenario
benchmark: 4 workers and 4 daemons time-sharing 2 cores), and more frequent exchanges lose on
them while they win in the lockstep study (docs/archive/BENCHMARKS-history.md, the in-process study of 2026-11-25 19:10). Here each node takes its next step at each tick with probability ``--step-prob`` (1:
lockstep), and every ``--every`` of its *own* steps it averages with one peer of the
exponential graph, the peer publishing first (publish on fetch, the daemons' default): the
daemons' exchange with the scheduling noise of a shared machine, nothing else.

    .venv/bin/python scripts/archive/study_desync.py --step-prob 0.5 --every 4 --jsonl run/s11/desync.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import study_skew as sk  # the study's helpers: its setup, top-k with int8 values, evaluation, schedule
import torch
import torch.nn.functional as F

from benchlib.results import append_jsonl
from p2pnode.models import build_model

torch.set_num_threads(1)


def run(args: argparse.Namespace) -> dict:
    su = sk.setup(args)
    test, xs, ys, steps, base, shapes, gens = su.test, su.xs, su.ys, su.steps, su.base, su.shapes, su.gens
    n, warm = args.nodes, 50
    models = [build_model("cnn", in_channels=1) for _ in range(n)]
    for m in models:
        m.load_state_dict(base.state_dict())
    dim = sum(shapes)
    mom = [torch.zeros(dim) for _ in range(n)]
    xhat = [sk.flat(base).clone() for _ in range(n)]
    published = [-1] * n  # the step of each node's last publish (at most one a step, as the worker)
    orders = [torch.randperm(len(y), generator=g) for y, g in zip(ys, gens)]
    pos, done = [0] * n, [0] * n
    rounds = [0] * n
    tick_rng = random.Random(args.seed)
    log2 = max(1, int(math.log2(n)))
    wire, spread_max, t0 = 0.0, 0, time.time()

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if pos[i] + args.batch > len(orders[i]):
            orders[i], pos[i] = torch.randperm(len(ys[i]), generator=gens[i]), 0
        idx = orders[i][pos[i]:pos[i] + args.batch]
        pos[i] += args.batch
        return xs[i][idx], ys[i][idx]

    def publish(j: int) -> None:
        nonlocal wire
        if published[j] == done[j]:
            return
        q = sk.topk_per_tensor(sk.flat(models[j]) - xhat[j], shapes, args.density)
        xhat[j] += q
        wire += sk.wire_bytes(q)
        published[j] = done[j]

    def lead_ref(i: int) -> int:
        others = sorted(done[k] for k in range(n) if k != i and done[k] < steps)
        if not others:
            return done[i]
        return others[(len(others) - 1) // 2] if args.lead_of == "median" else others[0]

    while min(done) < steps:
        for i in tick_rng.sample(range(n), n):  # who steps first in a tick: random too
            if done[i] >= steps or tick_rng.random() >= args.step_prob:
                continue
            if args.max_lead and done[i] - lead_ref(i) >= args.max_lead:
                continue  # --max-lead: a node this far ahead of the slowest (or the median peer) waits
            m = models[i]
            bx, by = batch(i)
            m.zero_grad()
            F.cross_entropy(m(bx), by).backward()
            g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
            if args.clip > 0:
                g.mul_(min(1.0, args.clip / max(float(g.norm()), 1e-12)))
            mom[i].mul_(args.beta).add_(g)
            sk.set_flat(m, sk.flat(m) - sk.lr_at(done[i], steps, args.lr, warm) * mom[i])
            done[i] += 1
            if done[i] % args.every == 0:
                rounds[i] += 1
                j = (i + 2 ** (rounds[i] % log2)) % n
                publish(j)  # the peer publishes when fetched
                x = sk.flat(m)
                sk.set_flat(m, x + 0.5 * (xhat[j] - x))
        spread_max = max(spread_max, max(done) - min(done))
    accs_before = [sk.evaluate(m, test.images, test.labels) for m in models]
    cur = [sk.flat(m) for m in models]
    for r in range(args.consensus):  # the consensus finish, as the study's
        for i in range(n):
            q = sk.topk_per_tensor(cur[i] - xhat[i], shapes, args.density)
            xhat[i] += q
            wire += sk.wire_bytes(q)
        cur = [cur[i] + 0.5 * (xhat[(i + 2 ** (r % log2)) % n] - cur[i]) for i in range(n)]
    for m, v in zip(models, cur):
        sk.set_flat(m, v)
    return {"accs_before": accs_before, "accs": [sk.evaluate(m, test.images, test.labels) for m in models],
            "max_steps_apart": spread_max, "wire_bytes_per_node": wire / n, "secs": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sk.add_common_args(ap)
    ap.add_argument("--step-prob", type=float, default=1.0, help="chance a node steps in a tick (1: lockstep)")
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--lead-of", default="min", help="--max-lead against the slowest peer (min) or the lower median peer (median)")
    ap.add_argument("--max-lead", type=int, default=0, help="a node at most this many steps ahead of the slowest (0: no bound)")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--value-bits", type=int, default=8)
    ap.add_argument("--consensus", type=int, default=20)
    args = ap.parse_args()
    sk.VALUE_BITS = args.value_bits
    res = run(args)
    res["args"] = vars(args)
    print(json.dumps(res))
    append_jsonl(args.jsonl, res)


if __name__ == "__main__":
    main()
