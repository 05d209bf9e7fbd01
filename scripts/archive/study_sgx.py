"""A study, not a benchmark: sparse *update* all-gather instead of model gossip, to see whether
it beats gossip on skewed shards for the bytes (it did not: docs/ALGORITHMS.md, "Tried and
dropped: sparse updates to every peer").

Deep Gradient Compression (Lin et al. 2018) over peers: each node accumulates lr x its
momentum-corrected gradient in a residual, sends the top-k of the residual to every peer each
step, and every node applies the mean of all nodes' sparse updates. In lockstep the nodes apply
the same updates, so they hold the same model whatever the shards (no drift at all); the price is
n - 1 copies of every update. The shards, model, schedule and evaluation are scripts/archive/study_skew.py's.

    .venv/bin/python scripts/archive/study_sgx.py --density 0.01 --mask-momentum --density-warm
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from study_skew import (
    add_common_args,
    evaluate,
    flat,
    lr_at,
    set_flat,
    setup,
    topk_per_tensor,
)

from benchlib.results import append_jsonl

torch.set_num_threads(1)


def run(args: argparse.Namespace) -> dict:
    su = setup(args)
    test, xs, ys, steps, model, shapes, gens = su.test, su.xs, su.ys, su.steps, su.base, su.shapes, su.gens
    n, warm = args.nodes, 50
    dim = sum(shapes)
    models = [flat(model).clone() for _ in range(n)]  # each node's model (equal in lockstep)
    u = [torch.zeros(dim) for _ in range(n)]  # momentum (local: DGC's momentum correction)
    v = [torch.zeros(dim) for _ in range(n)]  # residual: lr x momentum not yet sent
    sent = 0.0
    t0 = time.time()
    for s in range(steps):
        lr = lr_at(s, steps, args.lr, warm)
        dens = args.density
        if args.density_warm and s < warm * 4:  # DGC's warm-up: 25 %, 6.25 %, ... down to --density
            dens = max(args.density, 0.25 ** (1 + 4 * s // (warm * 4)))
        ups = []
        for i in range(n):
            set_flat(model, models[i])
            idx = torch.randint(len(ys[i]), (args.batch,), generator=gens[i])
            model.zero_grad()
            F.cross_entropy(model(xs[i][idx]), ys[i][idx]).backward()
            g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            if args.clip > 0:
                g.mul_(min(1.0, args.clip / max(float(g.norm()), 1e-12)))
            u[i].mul_(args.beta).add_(g)
            v[i].add_(u[i], alpha=lr)
            q = topk_per_tensor(v[i], shapes, dens)
            mask = q != 0
            v[i][mask] = 0
            if args.mask_momentum:  # DGC's momentum factor masking: no stale momentum where sent
                u[i][mask] = 0
            ups.append(q)
            sent += float(mask.sum()) * 5 * (n - 1)  # a byte of index and float32, to n - 1 peers
        total = sum(ups) / n
        models = [m - total for m in models]
    accs = []
    for m in models:
        set_flat(model, m)
        accs.append(evaluate(model, test.images, test.labels))
    return {"accs": accs, "secs": time.time() - t0, "wire_bytes_per_node": sent / n}


def main() -> None:
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--mask-momentum", action="store_true", help="zero the momentum where sent (DGC)")
    ap.add_argument("--density-warm", action="store_true", help="denser updates during 4x the warm-up (DGC)")
    args = ap.parse_args()
    res = run(args) | {"args": vars(args)}
    print(json.dumps(res))
    append_jsonl(args.jsonl, res)


if __name__ == "__main__":
    main()
