#!/usr/bin/env python3
"""One publish of a big model: exact top-k against the publisher's default selection.

``benchlib.sizetask``'s model (square linear layers of 2048 side by side) trained by SGD with
momentum on synthetic data, batch 1; every ``--steps`` steps two real ``DeltaPublisher``s of
the same model publish (top-10 % int8, the defaults): one selecting by exact ``torch.topk``
over every tensor (what every publish did before), one with the default selection
(``compression/sized.py``: exact below 1M values, LDTE-BS's estimated threshold at or above).
Each keeps its own x̂, so each carries its own residual. The two are timed in the same rounds,
their order alternating; one warm-up round first. One torch thread (the worker's).

Printed per size and selection: median seconds a publish (selection, rounding, x̂ update,
encoding), the share of values selected and sent (after int8 rounding drops entries) against
the configured density, the payload's bytes, and the speed-up over exact top-k.

    flock /work/notes/bigmem.lock nice -n 5 .venv/bin/python scripts/bench_publish.py --sizes 17M 124M
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchlib.results import table  # noqa: E402
from benchlib.sizetask import SideBySide, shape_for  # noqa: E402
from p2pnode.compression.registry import build_sparsifier  # noqa: E402
from p2pnode.wire.codec import decode  # noqa: E402
from p2pnode.wire.payload import Delta, ModelSpec  # noqa: E402
from p2pnode.worker.public import DeltaPublisher, floating_state  # noqa: E402


def size(text: str) -> int:
    mult = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}
    return int(float(text[:-1]) * mult[text[-1].upper()]) if text[-1].upper() in mult else int(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["17M", "124M"], help="parameters, e.g. 17M 124M")
    ap.add_argument("--rounds", type=int, default=5, help="timed publishes per selection (after one warm-up)")
    ap.add_argument("--steps", type=int, default=4, help="training steps between two publishes")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--dtype", default="int8", choices=["int8", "float16", "float32"])
    ap.add_argument("--task", choices=["sizetask", "gpt2"], default="sizetask",
                    help="gpt2: the GPT-2-small-shaped example (124M, --sizes ignored), AdamW, 64 random tokens a step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for text in (["GPT-2"] if args.task == "gpt2" else args.sizes):
        torch.manual_seed(0)
        if args.task == "gpt2":
            from p2pnode_gpt2 import GPT
            model: torch.nn.Module = GPT(50257, 1024, 768, 12, 12)
            opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
            shape = "GPT-2 small shape"

            def loss() -> torch.Tensor:
                x = torch.randint(0, 50257, (1, 65))
                return torch.nn.functional.cross_entropy(model(x[:, :-1]).reshape(-1, 50257), x[:, 1:].reshape(-1))
        else:
            width, layers = shape_for(size(text))
            model = SideBySide(width, layers)
            opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
            target = torch.randn(width, width) / width ** 0.5
            shape = f"{layers} x {width}²"

            def loss() -> torch.Tensor:
                x = torch.randn(1, width)
                return torch.nn.functional.mse_loss(model(x), x @ target.T)
        params = sum(t.numel() for t in floating_state(model).values())
        spec = ModelSpec.from_state_dict(floating_state(model), "fp-bench-publish")
        sparsifier = f"topk:density={args.density}"
        exact = DeltaPublisher(model, spec, build_sparsifier(sparsifier), "exact", "e", 0, args.dtype)
        exact.selector = exact.sparsifier  # torch.topk on every tensor: the old publish
        sized = DeltaPublisher(model, spec, build_sparsifier(sparsifier), "sized", "e", 0, args.dtype)
        pubs = {"exact top-k (before)": exact, "default: sized (after)": sized}
        times: dict[str, list[float]] = {k: [] for k in pubs}
        shares: dict[str, list[tuple[float, float]]] = {k: [] for k in pubs}
        nbytes: dict[str, list[int]] = {k: [] for k in pubs}
        step = 0
        for r in range(args.rounds + 1):
            for _ in range(args.steps):
                opt.zero_grad()
                loss().backward()
                opt.step()
                step += 1
            order = list(pubs) if r % 2 == 0 else list(reversed(pubs))
            for name in order:
                pub = pubs[name]
                t0 = time.perf_counter()
                body = pub.publish(step, 1.0)
                dt = time.perf_counter() - t0
                if r == 0:
                    continue  # warm-up: scratch buffers, first residual
                # sent: nonzero entries in the payload (long gaps travel as zero fillers); selected: before rounding dropped any (a build
                # without ``counts``, an older one run for its own "before", shows the sent share)
                delta = decode(body, spec)
                assert isinstance(delta, Delta)
                sent = sum(int(np.count_nonzero(v)) for _, v in delta.entries.values())
                sel = getattr(pub, "counts", (sent,))[0]
                times[name].append(dt)
                shares[name].append((sel / params / args.density, sent / params / args.density))
                nbytes[name].append(len(body))
            print(f"# {text}: round {r} done", flush=True)
        anchor = statistics.median(times["exact top-k (before)"])
        for name in pubs:
            med = statistics.median(times[name])
            chosen = [c for c, _ in shares[name]]
            carried = [c for _, c in shares[name]]
            rows.append([f"{text} ({shape}, {params / 1e6:.1f}M)", name,
                         f"{med:.2f} s ({min(times[name]):.2f}-{max(times[name]):.2f})",
                         f"{anchor / med:.1f}x",
                         f"{min(chosen):.3f}-{max(chosen):.3f}", f"{min(carried):.3f}-{max(carried):.3f}",
                         f"{statistics.median(nbytes[name]) / 1e6:.1f} MB"])
        del exact, sized, pubs, opt  # (the model goes when the next is built)
    print(table(["model", "selection", f"publish, median of {args.rounds} (min-max)", "speed-up",
                 "selected / (density x n)", "sent / (density x n)", "payload"], rows, "llrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
