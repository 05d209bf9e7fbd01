"""A study, not a benchmark: n nodes in one process, in lockstep, each on its shard of
Fashion-MNIST, gossiping through sparse public copies (top-k of x - x_hat every ``--every``
steps, averaged with one peer of the exponential graph), to compare algorithms for skewed data
quickly on one core before trying them in the daemon. ``--algo ddp`` is the all-reduce
reference on the same shards (gradients averaged every step), ``base`` local momentum SGD (the
daemon's ``training.optimizer = sgd``), ``qgm`` quasi-global momentum (``qgm``), ``diloco``
an outer Nesterov step on each round's displacement. The daemon's own figures come from
scripts/bench_scenarios.py.

    .venv/bin/python scripts/archive/study_skew.py --algo qgm --partition dirichlet:alpha=0.1
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from benchlib.results import append_jsonl
from p2pnode import partition as parts
from p2pnode.data import fashion_mnist
from p2pnode.models import build_model
from p2pnode.worker.robust import ClipRadius

torch.set_num_threads(1)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def set_flat(model: torch.nn.Module, vec: torch.Tensor) -> None:
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            p.copy_(vec[i:i + k].view_as(p))
            i += k


#: --value-bits: the kept values rounded to this many bits (symmetric, one scale per tensor); 0: float32
VALUE_BITS = 0
#: --dense-below: tensors with fewer entries are published whole; the others at --large-density
DENSE_BELOW = 0
FC_DENSITY = 0.0


#: --lowrank R: matrices (conv kernels as out x in*kh*kw) sent as rank-R factors of their change,
#: vectors whole; MATS holds each parameter's (rows, cols), or None for a vector
LOWRANK = 0
MATS: list = []
LAST_BYTES = 0.0


def _rounded(v: torch.Tensor) -> torch.Tensor:
    if VALUE_BITS:
        levels = 2 ** (VALUE_BITS - 1) - 1
        scale = float(v.abs().max()) / levels
        if scale > 0:
            return torch.round(v / scale) * scale
    return v


def lowrank_per_tensor(diff: torch.Tensor) -> torch.Tensor:
    """The best rank-R approximation (truncated SVD, PowerSGD's ideal) of each matrix's change,
    its factors rounded to --value-bits; what it costs on the wire in LAST_BYTES."""
    global LAST_BYTES
    out = torch.zeros_like(diff)
    vb = VALUE_BITS / 8 if VALUE_BITS else 4
    nbytes = 0.0
    i = 0
    for shp in MATS:
        k = shp[0] * shp[1] if shp[1] else shp[0]
        seg = diff[i:i + k]
        if shp[1] and min(shp) > LOWRANK:
            u, sv, vh = torch.linalg.svd(seg.view(shp), full_matrices=False)
            a = _rounded(u[:, :LOWRANK] * sv[:LOWRANK])
            b = _rounded(vh[:LOWRANK])
            out[i:i + k] = (a @ b).reshape(-1)
            nbytes += LOWRANK * (shp[0] + shp[1]) * vb
        else:
            out[i:i + k] = _rounded(seg)
            nbytes += k * vb
        i += k
    LAST_BYTES = nbytes
    return out


def topk_per_tensor(diff: torch.Tensor, shapes: list[int], density: float) -> torch.Tensor:
    if LOWRANK:
        return lowrank_per_tensor(diff)
    out = torch.zeros_like(diff)
    i = 0
    for k in shapes:
        seg = diff[i:i + k]
        dens = 1.0 if k < DENSE_BELOW else (FC_DENSITY or density)
        kk = max(1, int(k * dens)) if dens < 1 else k
        idx = seg.abs().topk(kk).indices
        vals = seg[idx]
        if VALUE_BITS:
            levels = 2 ** (VALUE_BITS - 1) - 1
            scale = float(vals.abs().max()) / levels
            if scale > 0:
                vals = torch.round(vals / scale) * scale
        out[i + idx] = vals
        i += k
    return out


def wire_bytes(q: torch.Tensor) -> float:
    """What the daemon's wire would carry: about a byte of delta-coded index per entry (lz4)
    and the value's bytes."""
    if LOWRANK:
        return LAST_BYTES
    return float((q != 0).sum()) * (1 + (VALUE_BITS / 8 if VALUE_BITS else 4))


def evaluate(model, test_x, test_y) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(test_y), 2000):
            correct += int((model(test_x[s:s + 2000]).argmax(1) == test_y[s:s + 2000]).sum())
    model.train()
    return correct / len(test_y)


def lr_at(step: int, steps: int, lr: float, warm: int) -> float:
    v = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
    if step < warm:
        v *= (step + 1) / (warm + 1)
    return v


@dataclass
class Setup:
    """What every study starts from: the nodes' shards, the test set, the schedule's length, the
    initial model (``--seed``) and each node's batch-order generator."""

    test: Any
    xs: list[torch.Tensor]
    ys: list[torch.Tensor]
    steps: int
    base: torch.nn.Module
    shapes: list[int]
    gens: list[torch.Generator]


def setup(args: argparse.Namespace) -> Setup:
    train, test = fashion_mnist(True), fashion_mnist(False)
    shards = parts.assign(train.labels.numpy(), parts.parse(args.partition), args.nodes, args.pseed)
    torch.manual_seed(args.seed)
    base = build_model("cnn", in_channels=1)
    return Setup(test, [train.images[torch.from_numpy(p)] for p in shards],
                 [train.labels[torch.from_numpy(p)] for p in shards], args.samples // args.batch, base,
                 [p.numel() for p in base.parameters()],
                 [torch.Generator().manual_seed(100 + i + 1000 * args.seed) for i in range(args.nodes)])


def run(args) -> dict:
    su = setup(args)
    test, xs, ys, steps, base, shapes, gens = su.test, su.xs, su.ys, su.steps, su.base, su.shapes, su.gens
    n = args.nodes
    warm = 50
    MATS[:] = [(p.shape[0], p[0].numel()) if p.dim() > 1 else (p.numel(), 0) for p in base.parameters()]
    orders = [torch.randperm(len(y), generator=g) for y, g in zip(ys, gens)]
    pos = [0] * n

    def batch(i):
        if pos[i] + args.batch > len(orders[i]):
            orders[i] = torch.randperm(len(ys[i]), generator=gens[i])
            pos[i] = 0
        idx = orders[i][pos[i]:pos[i] + args.batch]
        pos[i] += args.batch
        return xs[i][idx], ys[i][idx]

    t0 = time.time()
    bytes_sent = 0.0
    wire_sent = 0.0
    if args.algo == "ddp":
        model = base
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        for s in range(steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(s, steps, args.lr, warm)
            opt.zero_grad()
            loss = sum(F.cross_entropy(model(bx), by) for bx, by in (batch(i) for i in range(n))) / n
            loss.backward()
            if args.freeze_head:
                for p in list(model.parameters())[-2:]:
                    p.grad.zero_()
            if args.ddp_clip > 0:  # benchlib.ddp's anchor clips the averaged gradient as p2pnode's nodes clip theirs
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.ddp_clip)
            opt.step()
        acc = evaluate(model, test.images, test.labels)
        return {"accs": [acc] * n, "secs": time.time() - t0}

    models = [build_model("cnn", in_channels=1) for _ in range(n)]
    for m in models:
        m.load_state_dict(base.state_dict())
    dim = sum(shapes)
    mom = [torch.zeros(dim) for _ in range(n)]  # momentum buffers (flat)
    xhat = [flat(base).clone() for _ in range(n)]
    outer_v = [torch.zeros(dim) for _ in range(n)]
    corr = [torch.zeros(dim) for _ in range(n)]  # pi: integral of the averaging displacement
    # scaffold: each node's control variate (its mean gradient over the last round), the running
    # sum of this round's gradients, and its estimate of the network's mean control variate
    c_loc = [torch.zeros(dim) for _ in range(n)]
    g_sum = [torch.zeros(dim) for _ in range(n)]
    c_net = [torch.zeros(dim) for _ in range(n)]
    mhat = [torch.zeros(dim) for _ in range(n)]
    # gt: gradient tracking (Nedic et al. 2017; with momentum on the tracker, Takezawa et al.
    # 2022): each node steps along trk_i, its estimate of the network's mean gradient, kept by
    # trk_i <- mix(trk) + g_i(new) - g_i(old); the mix must keep the network's sum of trk
    trk = [torch.zeros(dim) for _ in range(n)]
    gprev = [torch.zeros(dim) for _ in range(n)]
    that = [torch.zeros(dim) for _ in range(n)]  # public copies of trk (CHOCO)
    log_prior = []
    for y in ys:
        counts = torch.bincount(y, minlength=10).float()
        log_prior.append(torch.log((counts + args.prior_eps * counts.sum() / 10) / counts.sum()))  # --m-mix topk: public copies of the momentum buffers
    net_counts = sum(torch.bincount(y, minlength=10).float() for y in ys)
    cw = []
    for y in ys:
        share = torch.bincount(y, minlength=10).float() / len(y)
        cw.append(torch.clamp((net_counts / net_counts.sum()) / share.clamp_min(1e-12), max=args.class_weight or 1.0))
    anchor = [flat(base).clone() for _ in range(n)]  # round start (diloco / qgm-round)
    H = args.every
    # --robust clip: the daemon's robust averaging (p2pnode/worker/robust.py), one radius per node
    clippers = [ClipRadius() if args.robust == "clip" else None for _ in range(n)]
    clip_stats = {"clipped": 0, "refused": 0, "exchanges": 0}

    def clip_scale(i: int, j: int, x: torch.Tensor) -> float:
        if clippers[i] is None:
            return 1.0
        dist = float((xhat[j] - x).norm() / x.norm())
        d = clippers[i].decide(str(j), dist)
        clip_stats["exchanges"] += 1
        clip_stats["clipped"] += d.clipped and not d.refused
        clip_stats["refused"] += d.refused
        return 0.0 if d.refused else d.scale

    mu = args.beta
    log2 = max(1, int(math.log2(n)))
    teacher = [flat(base).clone() for _ in range(n)]  # --ntd: each node's model after its last average
    scratch = build_model("cnn", in_channels=1)
    # --pace lr: exchange after a budget of summed learning rate (how far a node can have drifted)
    # instead of every H steps; the budget gives as many exchanges over the run as every H steps
    pace_budget = sum(lr_at(s, steps, args.lr, warm) for s in range(steps)) * H / steps
    pace_acc = 0.0
    rnd_count = 0
    hist = [[(-1, xhat[i])] for i in range(n)]  # --async-delay: each node's published copies by step
    rounds_i = [0] * n
    pending: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []  # --lag: copies in flight
    for s in range(steps):
        lr = lr_at(s, steps, args.lr, warm)
        for i in range(n):
            m = models[i]
            bx, by = batch(i)
            m.zero_grad()
            logits = m(bx)
            if args.logit_adjust:
                # logit adjustment by the node's own label prior (Menon et al. 2021; FedLC, Zhang
                # et al. 2022): the loss no longer pays a node for pushing down classes it lacks
                logits = logits + args.logit_adjust * log_prior[i]
            if args.class_weight:
                # importance weights (network's class share / the node's, capped): each node's
                # expected loss becomes the network's for the classes it holds
                loss = (F.cross_entropy(logits, by, reduction="none") * cw[i][by]).mean()
            else:
                loss = F.cross_entropy(logits, by)
            if args.ntd > 0:
                # not-true distillation (FedNTD, Lee et al. 2022): keep what the node's model knew
                # right after its last average about the classes a sample is *not*, so local steps
                # on a few classes do not erase the network's knowledge of the others
                set_flat(scratch, teacher[i])
                with torch.no_grad():
                    t_logits = scratch(bx)
                keep = torch.ones_like(logits, dtype=torch.bool)
                keep[torch.arange(len(by)), by] = False
                s_nt = logits[keep].view(len(by), -1) / args.ntd_tau
                t_nt = t_logits[keep].view(len(by), -1) / args.ntd_tau
                loss = loss + args.ntd * args.ntd_tau ** 2 * F.kl_div(
                    F.log_softmax(s_nt, 1), F.log_softmax(t_nt, 1), log_target=True, reduction="batchmean")
            loss.backward()
            if args.freeze_head:
                # a fixed classifier (FedBABU, Oh et al. 2022; FedETF): the last layer keeps its
                # initial weights, so local steps cannot tilt it towards the node's own classes
                for p in list(m.parameters())[-2:]:
                    p.grad.zero_()
            g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
            if args.clip > 0:  # the daemon's training.grad_clip (without it dir0.1 is on the edge of blowing up)
                g.mul_(min(1.0, args.clip / max(float(g.norm()), 1e-12)))
            x = flat(m)
            if args.prox > 0:
                # FedProx's proximal term (Li et al. 2020) towards the model after the last
                # average: local steps pay for wandering from what the network agreed on
                g = g + args.prox * (x - teacher[i])
            if args.algo in ("base", "pi", "scaffold"):
                if args.algo == "pi":
                    g = g + corr[i]
                if args.algo == "scaffold":
                    g_sum[i].add_(g)
                    g = g + args.c_gain * (c_net[i] - c_loc[i])
                mom[i].mul_(mu).add_(g)
                x -= (args.inner_lr_scale * lr) * (g + mu * mom[i]) if args.nesterov else (args.inner_lr_scale * lr) * mom[i]
            elif args.algo == "gt":
                trk[i].add_(g - gprev[i])
                gprev[i] = g
                mom[i].mul_(mu).add_(trk[i])
                x -= lr * mom[i]
            elif args.algo == "qgm":  # QG-DSGDm: heavy ball with quasi-global buffer
                d = g + mu * mom[i]
                x -= lr * d
            elif args.algo == "diloco":
                mom[i].mul_(args.beta).add_(g)  # inner momentum SGD, buffer reset each round
                x -= (args.inner_lr_scale * lr) * mom[i]
            set_flat(m, x)
        if args.async_delay >= 0:
            # asynchronous, as daemons are: node i publishes and fetches at its own phase of the
            # H steps, and averages in the peer's public copy as it was `--async-delay` steps ago
            for i in range(n):
                if (s + 1 + i) % H:
                    continue
                rounds_i[i] += 1
                j = (i + 2 ** (rounds_i[i] % log2)) % n
                # --fresh: the peer publishes when asked (its copy as of now), not on its own phase
                src_node = j if args.fresh else i
                q = topk_per_tensor(flat(models[src_node]) - xhat[src_node], shapes, args.density)
                xhat[src_node] = xhat[src_node] + q
                hist[src_node] = [*hist[src_node][-16:], (s, xhat[src_node])]
                wire_sent += wire_bytes(q)
                if args.lag:
                    # --lag D: the peer publishes when asked (now) and its copy lands D steps later;
                    # --compensate: then averaged against our own model as it was when we asked
                    pending.append((s + args.lag, i, xhat[j].clone(), flat(models[i]).clone()))
                    continue
                src = next((v for t, v in reversed(hist[j]) if t <= s - args.async_delay), hist[j][0][1])
                x = flat(models[i])
                set_flat(models[i], x + args.w * (src - x))
            for land, i, src, asked in [p for p in pending if p[0] == s]:
                x = flat(models[i])
                set_flat(models[i], x + args.w * (src - (asked if args.compensate else x)))
            pending[:] = [p for p in pending if p[0] > s]
            continue
        pace_acc += lr
        early = s < args.early_frac * steps  # --early-*: more gossip while the models change fast
        H_now = args.early_every if early and args.early_every else H
        dens_now = args.early_density if early and args.early_density else args.density
        if args.pace == "lr":
            exchange_now = pace_acc >= pace_budget
        else:
            exchange_now = (s + 1) % H_now == 0
        if exchange_now:
            pace_acc = 0.0
            rnd_count += 1
            # publish
            for i in range(n):
                q = topk_per_tensor(flat(models[i]) - xhat[i], shapes, dens_now)
                xhat[i] += q
                fetchers = n - 1 if args.mix in ("group", "seq") else 1  # every peer fetches it
                bytes_sent += (q != 0).sum().item() * 8 * fetchers
                wire_sent += wire_bytes(q) * fetchers
            rnd = rnd_count
            before = [flat(m) for m in models]
            newx = []
            for i in range(n):
                if args.selection == "ring":
                    j = (i + 1) % n
                else:
                    j = (i + 2 ** (rnd % log2)) % n
                if args.algo == "diloco":
                    newx.append(None)
                    continue
                if args.mix == "choco":  # CHOCO-SGD's consensus step: public copies only
                    newx.append(before[i] + args.w * (xhat[j] - xhat[i]))
                elif args.mix == "group":  # every peer's copy at once, uniformly (a group all-reduce)
                    newx.append((before[i] + sum(xhat[k] for k in range(n) if k != i)) / n)
                elif args.mix == "seq":  # every peer's copy, each averaged in with weight w as it lands
                    x = before[i]
                    for off in range(1, n):  # the daemon's exchange.peers_per_round = n - 1
                        x = x + args.w * (xhat[(i + off) % n] - x)
                    newx.append(x)
                else:
                    newx.append(before[i] + args.w * clip_scale(i, j, before[i]) * (xhat[j] - before[i]))
            if args.algo == "diloco":
                # local models mixed through the peer's public copy, then an outer Nesterov step
                # on the round's displacement from the round start (the pseudo-gradient)
                newx = []
                for i in range(n):
                    j = (i + 2 ** (rnd % log2)) % n if args.selection != "ring" else (i + 1) % n
                    mix = (1 - args.w) * before[i] + args.w * xhat[j]
                    delta = anchor[i] - mix
                    outer_v[i].mul_(args.outer_mom).add_(delta)
                    newx.append(anchor[i] - args.outer_lr * (delta + args.outer_mom * outer_v[i]))
                for i in range(n):
                    anchor[i] = newx[i].clone()
                    mom[i].zero_()
            for i in range(n):
                set_flat(models[i], newx[i])
                teacher[i] = newx[i].clone()
            if args.m_mix != "none":
                # the momentum buffers averaged with the same peer as the model: each node's buffer
                # is then (nearly) the network's, as in DDP, instead of a sum of its own gradients
                if args.m_mix == "topk":
                    for i in range(n):
                        q = topk_per_tensor(mom[i] - mhat[i], shapes, args.m_density)
                        mhat[i] += q
                        bytes_sent += (q != 0).sum().item() * 8
                src = mhat if args.m_mix == "topk" else [m.clone() for m in mom]
                newm = []
                for i in range(n):
                    j = (i + 1) % n if args.selection == "ring" else (i + 2 ** (rnd % log2)) % n
                    newm.append((1 - args.w) * mom[i] + args.w * src[j])
                mom = newm
            if args.algo == "gt":
                # the trackers mixed through public copies, CHOCO's rule (sum-preserving):
                # trk_i += w (that_j - that_i); dense float32 copies make it the plain average
                for i in range(n):
                    q = topk_per_tensor(trk[i] - that[i], shapes, args.y_density or dens_now)
                    that[i] += q
                    wire_sent += wire_bytes(q)
                    bytes_sent += (q != 0).sum().item() * 8
                newt = []
                for i in range(n):
                    j = (i + 1) % n if args.selection == "ring" else (i + 2 ** (rnd % log2)) % n
                    newt.append(trk[i] + args.w * (that[j] - that[i]))
                trk = newt
            if args.algo == "scaffold":
                # SCAFFOLD (Karimireddy et al. 2020, option I) over gossip: the local control
                # variate is the round's mean gradient; the network's mean is either exact
                # (an all-reduce of c, the idealised bound) or gossip-tracked with the same peer
                # as the model (c_net_i <- mix + c_new_i - c_old_i, gradient tracking on c)
                new_loc = [g_sum[i] / H for i in range(n)]
                if args.c_mix == "exact":
                    mean = sum(new_loc) / n
                    c_net = [mean.clone() for _ in range(n)]
                else:
                    old_net = [c.clone() for c in c_net]
                    for i in range(n):
                        j = (i + 1) % n if args.selection == "ring" else (i + 2 ** (rnd % log2)) % n
                        c_net[i] = (1 - args.w) * old_net[i] + args.w * old_net[j] + new_loc[i] - c_loc[i]
                    bytes_sent += n * dim * 4 * (args.c_density if args.c_density < 1 else 1)
                c_loc = new_loc
                for i in range(n):
                    g_sum[i].zero_()
            if args.algo == "pi":
                # integral feedback: a node that averaging keeps pulling one way is drifting the
                # other way; its correction grows until the pull is gone (EXTRA / PI consensus)
                # the peak rate, not this step's: near the end of a cosine schedule the pull left
                # over from earlier, larger steps divided by a rate near 0 would blow c up
                lr_eff = args.lr / (1 - mu)
                for i in range(n):
                    j = (i + 1) % n if args.selection == "ring" else (i + 2 ** (rnd % log2)) % n
                    # the pull between the two public copies: both lag their models alike, so the
                    # common motion cancels (x_hat_j - x_i would read that lag as drift)
                    pull = args.w * (xhat[j] - xhat[i]) if args.pull == "xhat" else newx[i] - before[i]
                    corr[i].add_(pull, alpha=-args.gain / (H * lr_eff))
                if args.verbose and rnd % 10 == 0:
                    print(rnd, f"lr={lr:.3f}", "c", [round(float(c.norm()), 3) for c in corr],
                          "g", round(float(g.norm()), 3), "spread", round(float((before[0] - before[1]).norm()), 3), flush=True)
        if args.algo == "qgm":
            # every step: momentum from displacement (gossip included when it happened this step)
            for i in range(n):
                x_now = flat(models[i])
                disp = (anchor[i] - x_now) / lr
                mom[i].mul_(mu).add_(disp, alpha=1 - mu)
                anchor[i] = x_now.clone()
    # consensus finish: exact gossip rounds over the public copies only
    accs_before = [evaluate(m, test.images, test.labels) for m in models]
    if args.save_final:  # each node's model before the consensus rounds (to study other weightings)
        torch.save([flat(m) for m in models], args.save_final)
    out = {"accs_before": accs_before}
    if args.consensus:
        xs_ = [flat(m) for m in models]
        for r in range(args.consensus):
            # nodes publish the full difference (the consensus phase uses top-k too)
            for i in range(n):
                q = topk_per_tensor(xs_[i] - xhat[i], shapes, args.density)
                xhat[i] += q
                bytes_sent += (q != 0).sum().item() * 8
                wire_sent += wire_bytes(q)
            new = []
            for i in range(n):
                j = (i + 2 ** (r % log2)) % n if args.selection != "ring" else (i + 1) % n
                if args.mix == "choco":
                    new.append(xs_[i] + 0.5 * (xhat[j] - xhat[i]))
                else:
                    new.append(xs_[i] + 0.5 * clip_scale(i, j, xs_[i]) * (xhat[j] - xs_[i]))
            xs_ = new
        for i in range(n):
            set_flat(models[i], xs_[i])
        out["spread_final"] = max(float((xs_[i] - xs_[0]).norm() / xs_[0].norm()) for i in range(n))
    out["accs"] = [evaluate(m, test.images, test.labels) for m in models]
    out["mean_model_acc"] = None
    avg = sum(flat(m) for m in models) / n
    set_flat(models[0], avg)
    out["mean_model_acc"] = evaluate(models[0], test.images, test.labels)
    out["secs"] = time.time() - t0
    out["rounds"] = rnd_count
    out["clip"] = clip_stats
    out["bytes_per_node"] = bytes_sent / n
    out["wire_bytes_per_node"] = wire_sent / n
    return out


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """The shards, schedule and output options every study shares (scripts/archive/study_sgx.py too)."""
    ap.add_argument("--partition", default="dirichlet:alpha=0.1")
    ap.add_argument("--pseed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--beta", type=float, default=0.9)
    ap.add_argument("--clip", type=float, default=5.0, help="largest gradient norm of a local step (0: none)")
    ap.add_argument("--seed", type=int, default=0, help="initial model and batch orders (0: the study's usual run)")
    ap.add_argument("--jsonl", default="", help="append the result to this JSON-lines file")


def main() -> None:
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--algo", default="base")
    ap.add_argument("--inner-lr-scale", type=float, default=1.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--w", type=float, default=0.5)
    ap.add_argument("--mix", default="model", help="model: x <- (1-w) x + w x_hat_peer (the daemon's); "
                    "choco: x <- x + w (x_hat_peer - x_hat_own), CHOCO-SGD's consensus step; "
                    "group: x <- the mean of x and every peer's x_hat (a group all-reduce); "
                    "seq: every peer's x_hat averaged in with weight w, one after another")
    ap.add_argument("--selection", default="exponential")
    ap.add_argument("--consensus", type=int, default=0)
    ap.add_argument("--gain", type=float, default=0.2, help="pi: integral gain")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--pull", default="xhat", help="pi: xhat (public copies) or model")
    ap.add_argument("--logit-adjust", type=float, default=0.0, help="tau of the logit adjustment by the local prior (0: off)")
    ap.add_argument("--prior-eps", type=float, default=0.01, help="smoothing of the local prior (share of a uniform class)")
    ap.add_argument("--value-bits", type=int, default=0, help="published values rounded to this many bits (0: float32)")
    ap.add_argument("--m-mix", default="none", help="momentum averaged with the peer: none, exact, topk")
    ap.add_argument("--m-density", type=float, default=0.1, help="--m-mix topk: density of the momentum delta")
    ap.add_argument("--c-mix", default="exact", help="scaffold: exact (all-reduce of c) or gossip")
    ap.add_argument("--c-gain", type=float, default=1.0, help="scaffold: weight of the correction")
    ap.add_argument("--c-density", type=float, default=1.0, help="scaffold: bytes counted for c (fraction)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-mom", type=float, default=0.9)
    ap.add_argument("--robust", default="none", help="clip: the daemon's robust averaging (exchange.robust)")
    ap.add_argument("--async-delay", type=int, default=-1,
                    help=">= 0: nodes exchange at staggered phases, with the peer's copy this many steps old")
    ap.add_argument("--fresh", action="store_true", help="--async-delay: the peer publishes when fetched")
    ap.add_argument("--save-final", default="", help="save the nodes' models before the consensus rounds here")
    ap.add_argument("--pace", default="steps", help="steps: exchange every --every steps; lr: after as much summed lr")
    ap.add_argument("--dense-below", type=int, default=0, help="tensors with fewer entries published whole")
    ap.add_argument("--large-density", type=float, default=0.0, help="density of the other tensors (0: --density)")
    ap.add_argument("--early-frac", type=float, default=0.0, help="share of the steps counted as early")
    ap.add_argument("--early-every", type=int, default=0, help="exchange period while early (0: --every)")
    ap.add_argument("--early-density", type=float, default=0.0, help="publish density while early (0: --density)")
    ap.add_argument("--ddp-clip", type=float, default=0.0,
                    help="--algo ddp: clip the averaged gradient to this norm (benchlib.ddp's anchor: 5; 0: none, as before)")
    ap.add_argument("--lag", type=int, default=0, help="--async-delay 0 --fresh: the copy lands this many steps after the ask")
    ap.add_argument("--compensate", action="store_true", help="--lag: average against our model as it was when we asked")
    ap.add_argument("--ntd", type=float, default=0.0, help="weight of not-true distillation from the model after the last average (0: off)")
    ap.add_argument("--y-density", type=float, default=0.0, help="gt: density of the tracker's publish (0: --density)")
    ap.add_argument("--freeze-head", action="store_true", help="the last layer keeps its initial weights")
    ap.add_argument("--lowrank", type=int, default=0, help="publish rank-R factors of each matrix's change (0: top-k)")
    ap.add_argument("--ntd-tau", type=float, default=1.0, help="--ntd: softmax temperature")
    ap.add_argument("--class-weight", type=float, default=0.0, help="cap of the class importance weights (0: off)")
    ap.add_argument("--prox", type=float, default=0.0, help="FedProx's mu: the gradient gains mu (x - the model after the last average)")
    args = ap.parse_args()
    global VALUE_BITS, DENSE_BELOW, FC_DENSITY, LOWRANK
    LOWRANK = args.lowrank
    VALUE_BITS = args.value_bits
    DENSE_BELOW = args.dense_below
    FC_DENSITY = args.large_density
    res = run(args)
    res["args"] = vars(args)
    line = json.dumps(res)
    print(line)
    append_jsonl(args.jsonl, res)


if __name__ == "__main__":
    main()
