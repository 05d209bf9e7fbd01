#!/usr/bin/env python3
"""Top-k selection speed: every sparsifier against torch.topk, side by side, medians.

For each tensor size (default 1 M, 10 M, 25 M float32) and density (1 %, 0.1 %), every
method is timed in the same run, interleaved round by round (so background load hits all
alike), one warm-up call first (it allocates the sparsifier's scratch buffers); the table
shows the median time per call, the speed-up over ``torch.topk(x.abs(), k)`` and the achieved
density (kept / n) relative to the target. Then the bytes on the wire of every compressor for
one real gradient of the small CNN, against dense fp32.

Data: ``laplace`` (what LDTE-BS assumes), ``gaussian`` (lighter tails), ``cnn`` (the small
CNN's real gradient on Fashion-MNIST, all layers concatenated and tiled to size with 1 %
multiplicative jitter so that copies do not tie).

    .venv/bin/python scripts/bench_select.py                     # everything (~4 min here)
    .venv/bin/python scripts/bench_select.py --sizes 1e6 --dists laplace --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from p2pnode.compression import build, names, payload_bytes
from p2pnode.compression.base import kept_count

SPARSIFIERS = ["topk", "ldte-bs", "ldte", "dgc", "rgc", "gaussiank", "randomk", "mean-threshold",
               "strom"]


def cnn_gradients(steps: int = 20) -> dict[str, torch.Tensor]:
    """One mini-batch gradient of the small CNN after ``steps`` SGD steps (batch 64)."""
    from p2pnode.data import DataError, fashion_mnist, synthetic
    from p2pnode.models import build_model

    torch.manual_seed(0)
    try:
        split = fashion_mnist(train=True)
        source = "Fashion-MNIST"
    except DataError:
        split = synthetic(64 * (steps + 1), seed=0)
        source = "synthetic (Fashion-MNIST absent)"
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for i in range(steps + 1):
        xb = split.images[i * 64:(i + 1) * 64]
        yb = split.labels[i * 64:(i + 1) * 64]
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        if i < steps:
            opt.step()
    print(f"# CNN gradients from {source}, after {steps} SGD steps, batch 64")
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def make_data(dist: str, n: int, grads: dict[str, torch.Tensor] | None) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if dist == "laplace":
        return torch.distributions.Laplace(0.0, 1.0).sample((n,))
    if dist == "gaussian":
        return torch.randn(n, generator=g)
    assert grads is not None
    base = torch.cat([t.reshape(-1) for t in grads.values()])
    reps = -(-n // base.numel())
    tiled = base.repeat(reps)[:n]
    return tiled * (1.0 + 0.01 * torch.randn(n, generator=g))


def spec_for(name: str, density: float, x: torch.Tensor) -> str:
    if name == "mean-threshold":
        return name
    if name == "strom":
        # a fixed threshold: set once to the exact top-k threshold of this tensor
        k = kept_count(x.numel(), density)
        tau = float(torch.topk(x.abs(), k, sorted=False).values.min())
        return f"strom:tau={tau!r}"
    return f"{name}:density={density}"


def bench_select(sizes: list[int], densities: list[float], dists: list[str], repeats: int,
                 grads: dict[str, torch.Tensor] | None) -> list[tuple[str, int, float, str, float, str]]:
    print("\n## Selection time per call (median), 1 thread\n")
    print("| data | n | density | method | median ms | vs torch.topk | kept / k |")
    print("|---|---:|---:|---|---:|---:|---:|")
    rows: list[tuple[str, int, float, str, float, str]] = []
    for dist in dists:
        for n in sizes:
            x = make_data(dist, n, grads)
            for density in densities:
                k = kept_count(n, density)
                methods = {"torch.topk": lambda x=x, k=k: torch.topk(x.abs(), k, sorted=False).indices}
                kept: dict[str, list[int]] = {"torch.topk": []}
                for name in SPARSIFIERS:
                    if name == "mean-threshold" and density != densities[0]:
                        continue
                    s = build(spec_for(name, density, x))
                    methods[name] = s.select
                    kept[name] = []
                times: dict[str, list[float]] = {m: [] for m in methods}
                for m, f in methods.items():  # warm-up: scratch buffers, caches
                    kept[m].append(f(x).numel())
                for _ in range(repeats):
                    for m, f in methods.items():
                        t0 = time.perf_counter()
                        idx = f(x)
                        times[m].append(time.perf_counter() - t0)
                        kept[m].append(idx.numel())
                base = statistics.median(times["torch.topk"])
                for m in methods:
                    med = statistics.median(times[m])
                    ks = kept[m]
                    ratio = f"{min(ks) / k:.3f}" if min(ks) == max(ks) else f"{min(ks) / k:.3f}-{max(ks) / k:.3f}"
                    label = f"{m} ({spec_for(m, density, x).split(':')[0]} thr.)" if m == "strom" else m
                    dens = "" if m == "mean-threshold" else f"{density:g}"
                    if m == "mean-threshold":
                        ratio = f"{ks[-1] / n:.3f} of n"
                    print(f"| {dist} | {n / 1e6:g} M | {dens or 'n/a'} | {label} | {med * 1e3:.1f} "
                          f"| {base / med:.1f}x | {ratio} |", flush=True)
                    rows.append((dist, n, density, m, med, ratio))
                del methods
            del x
    return rows


def summary(rows: list[tuple[str, int, float, str, float, str]]) -> None:
    """One line per (data, n, density): ms per call and kept/k of each method."""
    methods = [m for m in ["torch.topk"] + SPARSIFIERS if any(r[3] == m for r in rows)]
    print("\n## Summary: median ms per call (kept / k); speed-up of ldte-bs over torch.topk\n")
    print("| data | n | density | " + " | ".join(methods) + " | ldte-bs speed-up |")
    print("|---|---:|---:|" + "---:|" * (len(methods) + 1))
    keys = list(dict.fromkeys((r[0], r[1], r[2]) for r in rows))
    for key in keys:
        cells = {r[3]: r for r in rows if (r[0], r[1], r[2]) == key}
        out = []
        for m in methods:
            r = cells.get(m)
            out.append("" if r is None else f"{r[4] * 1e3:.1f} ({r[5]})")
        speed = cells["torch.topk"][4] / cells["ldte-bs"][4] if "ldte-bs" in cells else float("nan")
        print(f"| {key[0]} | {key[1] / 1e6:g} M | {key[2]:g} | " + " | ".join(out) + f" | {speed:.1f}x |")


def bench_bytes(grads: dict[str, torch.Tensor]) -> None:
    print("\n## Bytes on the wire for one gradient of the small CNN\n")
    total_numel = sum(g.numel() for g in grads.values())
    dense = sum(payload_bytes(build("none").compress(g, n)[0]) for n, g in grads.items())
    print(f"{len(grads)} tensors, {total_numel} elements; dense fp32 = {dense} bytes\n")
    print("| compressor | bytes | vs dense fp32 | ratio |")
    print("|---|---:|---:|---:|")
    specs = []
    for name in names():
        if name == "strom":
            specs.append("strom:tau=0.001")
        elif name in ("topk", "ldte-bs", "ldte", "dgc", "rgc", "gaussiank", "randomk"):
            specs += [f"{name}:density=0.01", f"{name}:density=0.001"]
        elif name == "powersgd":
            specs += ["powersgd:rank=1", "powersgd:rank=4"]
        elif name == "qsgd":
            specs += ["qsgd:levels=16", "qsgd:levels=4", "qsgd:levels=1"]
        else:
            specs.append(name)
    for spec in specs:
        comp = build(spec)
        total = sum(payload_bytes(comp.compress(g, n)[0]) for n, g in grads.items())
        print(f"| {comp.spec} | {total} | {100 * total / dense:.2f} % | {dense / total:.1f}x |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 10e6, 25e6])
    ap.add_argument("--densities", nargs="+", type=float, default=[0.01, 0.001])
    ap.add_argument("--dists", nargs="+", default=["laplace", "gaussian", "cnn"],
                    choices=["laplace", "gaussian", "cnn"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-bytes", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}")
    grads = cnn_gradients() if ("cnn" in args.dists or not args.no_bytes) else None
    rows = bench_select([int(s) for s in args.sizes], args.densities, args.dists, args.repeats, grads)
    summary(rows)
    if not args.no_bytes and grads is not None:
        bench_bytes(grads)


if __name__ == "__main__":
    main()
