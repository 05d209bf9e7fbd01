#!/usr/bin/env python3
"""Training with each gradient compressor: the small CNN on Fashion-MNIST, one process.

Every run starts from the same initial weights and sees the same batches in the same order
(batch 64, ``--steps`` steps, SGD lr 0.05 momentum 0.9, 1 thread). Each step the gradient of
every parameter goes through ``GradientPipeline(spec, memory)``; the optimizer steps with what
comes out. Reported: final test accuracy on the 10 000 test images, the bytes the gradients
would have taken on the wire (real msgpack payload sizes, summed over all steps), and the
ratio to dense fp32 (``none``).

Exceptions, stated in the table: ``dgc`` runs with memory "dgc" (momentum correction inside the
memory, so the optimizer has momentum 0); ``signsgd`` (unscaled +-1) uses lr 0.0001;
``randomk`` (unscaled, error feedback) runs without optimizer momentum (with momentum 0.9 it
diverged); ``terngrad`` uses the paper's clipping at 2.5 sigma (without it, it diverged at
lr 0.05).

    .venv/bin/python scripts/bench_train_compression.py              # 938 steps = 1 epoch
    .venv/bin/python scripts/bench_train_compression.py --steps 100 --only none topk
"""

from __future__ import annotations

import argparse
import time

import torch

from p2pnode.compression import GradientPipeline
from p2pnode.data import DataError, fashion_mnist, synthetic
from p2pnode.models import build_model

#: (label, spec, memory, lr, momentum)
RUNS: list[tuple[str, str, str, float, float]] = [
    ("none", "none", "none", 0.05, 0.9),
    ("mean-threshold", "mean-threshold", "none", 0.05, 0.9),
    ("mean-threshold+ef", "mean-threshold", "residual", 0.05, 0.9),
    ("topk", "topk:density=0.01", "residual", 0.05, 0.9),
    ("ldte-bs", "ldte-bs:density=0.01", "residual", 0.05, 0.9),
    ("dgc", "dgc:density=0.01", "dgc", 0.05, 0.0),
    ("rgc", "rgc:density=0.01", "residual", 0.05, 0.9),
    ("gaussiank", "gaussiank:density=0.01", "residual", 0.05, 0.9),
    ("randomk", "randomk:density=0.01,scale=false", "residual", 0.05, 0.0),
    ("fp16", "fp16", "none", 0.05, 0.9),
    ("bf16", "bf16", "none", 0.05, 0.9),
    ("qsgd", "qsgd:levels=16", "none", 0.05, 0.9),
    ("terngrad", "terngrad:clip=2.5", "none", 0.05, 0.9),
    ("signsgd", "signsgd", "none", 0.0001, 0.9),
    ("ef-signsgd", "ef-signsgd", "residual", 0.05, 0.9),
    ("onebit", "onebit", "residual", 0.05, 0.9),
    ("powersgd", "powersgd:rank=2", "residual", 0.05, 0.9),
]


def load() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str]:
    try:
        tr, te = fashion_mnist(train=True), fashion_mnist(train=False)
        return tr.images, tr.labels, te.images, te.labels, "Fashion-MNIST"
    except DataError:
        tr, te = synthetic(60_000, seed=0), synthetic(10_000, seed=1)
        return tr.images, tr.labels, te.images, te.labels, "synthetic (Fashion-MNIST absent)"


@torch.no_grad()
def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(labels), 1000):
        correct += int((model(images[i:i + 1000]).argmax(1) == labels[i:i + 1000]).sum())
    model.train()
    return correct / len(labels)


def run(spec: str, memory: str, lr: float, momentum: float, steps: int, data, init_state,
        order: torch.Tensor) -> tuple[float, int, float, float]:
    xtr, ytr, xte, yte = data
    model = build_model("cnn")
    model.load_state_dict(init_state)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    pipe = GradientPipeline(spec, memory)
    loss_fn = torch.nn.CrossEntropyLoss()
    sent = 0
    comp_time = 0.0
    t0 = time.perf_counter()
    for step in range(steps):
        idx = order[(step * 64) % len(order):][:64]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xtr[idx]), ytr[idx])
        loss.backward()
        c0 = time.perf_counter()
        pipe.begin_step()
        for name, p in model.named_parameters():
            p.grad = pipe.apply(name, p.grad)
        sent += pipe.last_payload_bytes
        comp_time += time.perf_counter() - c0
        opt.step()
        if not torch.isfinite(loss):
            break
    wall = time.perf_counter() - t0
    return accuracy(model, xte, yte), sent, wall, comp_time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=938, help="steps per run (938 = 1 epoch of 60k at 64)")
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte, source = load()
    torch.manual_seed(0)
    init_state = {k: v.clone() for k, v in build_model("cnn").state_dict().items()}
    order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(0))
    print(f"# small CNN, {source}, {args.steps} steps of batch 64, 1 thread, torch {torch.__version__}")
    print("\n| compressor | spec | memory | lr / momentum | test acc | bytes sent | vs dense | "
          "compress ms/step | run s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    dense_bytes = None
    for label, spec, memory, lr, mom in RUNS:
        if args.only and label not in args.only:
            continue
        acc, sent, wall, ctime = run(spec, memory, lr, mom, args.steps, (xtr, ytr, xte, yte),
                                     init_state, order)
        if label == "none":
            dense_bytes = sent
        rel = f"{100 * sent / dense_bytes:.2f} %" if dense_bytes else "?"
        print(f"| {label} | `{spec}` | {memory} | {lr:g} / {mom:g} | {100 * acc:.2f} % | {sent:,} | "
              f"{rel} | {1e3 * ctime / args.steps:.2f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
