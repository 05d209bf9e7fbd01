"""The lockstep study's other end: every node applies the *same* update every step, the
network's mean gradient compressed by PowerSGD, so no node ever drifts.

Why: on skewed shards every way of averaging *models* measured (gossip, every peer at once,
local SGD's exact average every few steps) stays 1–3 pt under DDP within the byte budget
(1/30 of DDP's), because between two averages each node steps along its own classes'
gradient. A synchronous all-reduce of *gradients* has no such drift; what it costs is bytes,
which PowerSGD (Vogels, Karimireddy, Jaggi 2019, *PowerSGD: Practical Low-Rank Gradient
Compression*) cuts to a rank-r approximation: P = M Q and Q' = Mᵀ orth(P), each summed over the
nodes (the sums are linear, so a ring all-reduce carries them), warm-started Q, and each
node's error feedback (M = its gradient + what its last approximation left out). This study
measures how close that comes to DDP on the same shards and at what bytes: the bound for a
synchronous mode, which the daemon does not have.

Bytes are counted as the study's DDP is: each all-reduce moves 2 (n − 1) / n times its payload
a node, so the ratio to DDP's bytes is the payload's size over the model's (``--value-bits 8``:
each node's contribution and the sum rounded to int8 with one scale per column).

    .venv/bin/python scripts/archive/study_sync.py --rank 4 [--value-bits 8] [--partition classes:k=2] --jsonl run/s23/study.jsonl
    .venv/bin/python scripts/archive/study_sync.py --rank 0 --value-bits 16 --seed S    # DDP over float16: the noise floor
"""

from __future__ import annotations

import argparse
import json
import time

import study_skew as sk  # the study's setup, schedule and evaluation
import torch
import torch.nn.functional as F

from benchlib.results import append_jsonl
from p2pnode.sync.values import decode, encode

torch.set_num_threads(1)


#: float16 with a power-of-two scale a tensor (--scaled): the tensor's largest entry near 2^14
SCALED = False
#: int8 as the daemon sends it (--int8-blocks; p2pnode/sync/values.py): blocks of 64 values a
#: scale, each column of a factor (and each whole tensor) starting a block of its own
BLOCKS = False


def blockwise(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to int8 by the daemon's own codec: a matrix (a factor, rows x rank) column
    by column, any other tensor flat, each its own blocks (as ``PowerSync`` pads them)."""
    cols = t.t() if t.dim() == 2 else t.reshape(1, -1)
    out = torch.stack([torch.from_numpy(decode(encode(c.numpy(), "int8"), "int8")).float() for c in cols])
    return out.t().contiguous() if t.dim() == 2 else out.reshape(t.shape)


def rounded(t: torch.Tensor, bits: int) -> torch.Tensor:
    """``t`` as it would cross the wire: float32 (0), float16 (16) or int8 with one absmax
    scale per column (8). Float16 alone flushes a gradient's smallest entries (below 6e-5 it
    has fewer mantissa bits, below 6e-8 none): with ``SCALED`` the tensor is first multiplied
    by a power of two (exact) that brings its largest entry near 2^14."""
    if bits == 0:
        return t
    if bits == 16:
        if SCALED:
            peak = float(t.abs().max())
            if peak > 0:
                shift = 14 - torch.frexp(torch.tensor(peak)).exponent.item()
                return torch.ldexp(torch.ldexp(t, torch.tensor(shift)).half().float(), torch.tensor(-shift))
        return t.half().float()
    if BLOCKS:
        return blockwise(t)
    levels = 2 ** (bits - 1) - 1
    scale = t.abs().amax(0, keepdim=True).clamp_min(1e-12) / levels
    return torch.round(t / scale) * scale


def run(args: argparse.Namespace) -> dict:
    su = sk.setup(args)
    n, steps, warm = args.nodes, su.steps, 50
    orders = [torch.randperm(len(y), generator=g) for y, g in zip(su.ys, su.gens)]
    pos = [0] * n

    def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if pos[i] + args.batch > len(orders[i]):
            orders[i] = torch.randperm(len(su.ys[i]), generator=su.gens[i])
            pos[i] = 0
        idx = orders[i][pos[i]:pos[i] + args.batch]
        pos[i] += args.batch
        if i == n - 1 and args.last_share < 1:  # a slow node keeping pace on a part of its batch
            idx = idx[:max(2, round(args.batch * args.last_share))]
        return su.xs[i][idx], su.ys[i][idx]

    model = su.base  # one model: every node holds the same weights at every step
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=args.lr, momentum=args.beta)
    err = [[torch.zeros_like(p) for p in params] for _ in range(n)]  # each node's error feedback
    qs: dict[int, torch.Tensor] = {}  # warm-started Q per matrix, the same on every node
    ps: dict[int, torch.Tensor] = {}  # --alternate: the last shared P per matrix
    gen = torch.Generator().manual_seed(args.seed)
    sent, size = 0.0, sum(p.numel() for p in params)
    t0 = time.time()
    if args.drop_last:  # a slow node whose gradients are all dropped: the mean is of the others
        n -= 1
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = sk.lr_at(s, steps, args.lr, warm)
        grads = []
        for i in range(n):  # n: less the last node with --drop-last
            bx, by = batch(i)
            gi = torch.autograd.grad(F.cross_entropy(model(bx), by), params)
            grads.append([a + e for a, e in zip(gi, err[i])])
        for k, p in enumerate(params):
            rows, cols = p.shape[0], p[0].numel()
            r = min(args.rank, rows, cols)
            if args.rank == 0:  # the dense mean, each node's part and the sum rounded (DDP over float16)
                p.grad = rounded(sum(rounded(g[k], args.value_bits) for g in grads) / n, args.value_bits)
                sent += p.numel() * (args.value_bits or 32) / 32
                continue
            if p.dim() < 2 or (rows + cols) * r * args.min_compression_rate >= rows * cols:  # vectors, small matrices whole
                if args.round_dense:  # as the daemon sends them: each part and the mean rounded
                    parts = [rounded(g[k], args.value_bits) for g in grads]
                    p.grad = rounded(sum(parts) / n, args.value_bits)
                    for i in range(n):  # what the rounding left out: kept (--dense-feedback) or lost
                        err[i][k] = grads[i][k] - parts[i] if args.dense_feedback else torch.zeros_like(p)
                else:
                    p.grad = sum(g[k] for g in grads) / n
                    for i in range(n):
                        err[i][k].zero_()
                sent += p.numel() * (args.value_bits or 32) / 32
                continue
            ms = [g[k].reshape(rows, cols) for g in grads]
            if k not in qs:
                qs[k] = torch.randn(cols, r, generator=gen)
            if args.alternate:  # ACP-SGD: one factor a step, against the other one as last shared
                if s % 2 == 0 or k not in ps:  # P = M Q̂, Q̂ the last shared Q orthonormalised
                    fixed, _ = torch.linalg.qr(qs[k])
                    parts = [rounded(m @ fixed, args.value_bits) for m in ms]
                    ps[k] = mean = rounded(sum(parts) / n, args.value_bits)
                    approx = mean @ fixed.t()
                    owns = [(part if args.owe_rounding else m @ fixed) @ fixed.t() for part, m in zip(parts, ms)]
                    sent += rows * r * (args.value_bits or 32) / 32
                else:  # Q = Mᵀ P̂, P̂ the last shared P orthonormalised
                    fixed, _ = torch.linalg.qr(ps[k])
                    parts = [rounded(m.t() @ fixed, args.value_bits) for m in ms]
                    qs[k] = mean = rounded(sum(parts) / n, args.value_bits)
                    approx = fixed @ mean.t()
                    owns = [fixed @ (part if args.owe_rounding else m.t() @ fixed).t() for part, m in zip(parts, ms)]
                    sent += cols * r * (args.value_bits or 32) / 32
                for i in range(n):  # each node's own residual
                    err[i][k] = (ms[i] - owns[i]).reshape(p.shape)
                p.grad = approx.reshape(p.shape).clone()
                continue
            pm = rounded(sum(rounded(m @ qs[k], args.value_bits) for m in ms) / n, args.value_bits)
            pm, _ = torch.linalg.qr(pm)
            parts = [rounded(m.t() @ pm, args.value_bits) for m in ms]
            qm = rounded(sum(parts) / n, args.value_bits)
            qs[k] = qm
            approx = pm @ qm.t()
            sent += (rows + cols) * r * (args.value_bits or 32) / 32
            for i in range(n):  # --local-residual: the node's own M less its projection on the shared P
                if args.local_residual:  # --owe-rounding: less its part as rounded, so the rounding is owed
                    own = pm @ (parts[i] if args.owe_rounding else ms[i].t() @ pm).t()
                else:
                    own = approx
                err[i][k] = (ms[i] - own).reshape(p.shape)
            p.grad = approx.reshape(p.shape).clone()
        if args.clip > 0:  # as the study's DDP anchor (--ddp-clip 5): the mean gradient clipped
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
    acc = sk.evaluate(model, su.test.images, su.test.labels)
    return {"algo": "powersgd", "accs": [acc] * n, "rank": args.rank, "value_bits": args.value_bits,
            "bytes_of_ddp": sent / (size * steps), "secs": time.time() - t0, "args": vars(args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sk.add_common_args(ap)
    ap.add_argument("--rank", type=int, default=4,
                    help="PowerSGD's rank (0: no PowerSGD, the dense mean gradient rounded to --value-bits: "
                         "with 16, DDP over float16, how far a run moves from DDP for a rounding alone)")
    ap.add_argument("--value-bits", type=int, default=0, choices=(0, 8, 16),
                    help="the factors' values on the wire: float32 (0), float16 or int8")
    ap.add_argument("--min-compression-rate", type=float, default=1.0,
                    help="a matrix is factored only when that divides its size by at least this (PyTorch's "
                         "PowerSGD hook: min_compression_rate, 2 by default); the others go whole")
    ap.add_argument("--last-share", type=float, default=1.0,
                    help="the last node trains on this part of each batch (exchange.sync_keep_pace)")
    ap.add_argument("--drop-last", action="store_true", help="the last node's gradients never count")
    ap.add_argument("--scaled", action="store_true", help="--value-bits 16: a power-of-two scale a tensor")
    ap.add_argument("--round-dense", action="store_true",
                    help="the tensors sent whole are rounded to --value-bits too, each node's part and the "
                         "mean (as the daemon's wire does; without it they cross in float32)")
    ap.add_argument("--dense-feedback", action="store_true",
                    help="with --round-dense: each node keeps what rounding its whole tensors left out and "
                         "adds it to the next step's (error feedback for the whole tensors)")
    ap.add_argument("--local-residual", action="store_true",
                    help="each node's error is its own M less M's projection on the shared P (the mean of these "
                         "is the mean's residual, as with the usual M - P Q'^T, but a node's own lean within P "
                         "no longer piles up in its error)")
    ap.add_argument("--alternate", action="store_true",
                    help="ACP-SGD (Zhang et al. 2023): one factor a step, P = M Q̂ then Q = Mᵀ P̂ against the other "
                         "factor as last shared (orthonormalised): one all-reduce a step instead of two, about half "
                         "the bytes at a rank; each node's error its own residual")
    ap.add_argument("--owe-rounding", action="store_true",
                    help="with --local-residual: the projection is of the node's part as rounded for the wire, so "
                         "the rounding of its part is owed (error feedback) rather than lost")
    ap.add_argument("--int8-blocks", action="store_true",
                    help="--value-bits 8 as the daemon's wire has it: blocks of 64 values a scale, each column its own")
    args = ap.parse_args()
    global SCALED, BLOCKS
    SCALED, BLOCKS = args.scaled, args.int8_blocks
    res = run(args)
    print(json.dumps(res))
    append_jsonl(args.jsonl, res)


if __name__ == "__main__":
    main()
