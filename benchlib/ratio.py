"""The ``ratio`` condition's link rate for scripts/experiment.py: the rate that gives the small
CNN the paper's ratio of dense transfer time to compute per batch.

The paper (Cui 2019) trains VGG-19 for CIFAR-10 (20.04 M float32 parameters) on 300 Mbit/s
links, and its fastest decentralised batch took 0.58 s (Table I): one dense transfer costs
641 Mbit / 300 Mbit/s = 2.138 s = 3.686 batches of compute. The CNN's dense bits over (3.686 x
its seconds per batch here) is the rate with the same ratio.

Measuring the batch needs an otherwise idle machine (on shared cores the measurement moves with
the load, and the rate with it), so the experiment reuses the measurement written here
(``MEASURED``, taken on this 2-core machine for the first full run) unless asked to measure
again (``--measure-ratio``); the log and the report say which.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

#: the paper's numbers: VGG-19 for CIFAR-10 (20.04 M parameters, torchvision's VGG-19 features
#: with a 512-wide classifier), float32, on its 300 Mbit/s links; its fastest decentralised batch
#: (Table I: 0.58 s) bounds its compute per batch from above
PAPER_PARAMS, PAPER_LINK_BITS, PAPER_BATCH_S = 20.04e6, 300e6, 0.58
#: the measurement of the first full run (2026-11-24 00:29 UTC, this machine, load average 4.6):
#: what ``measure`` returned then; reused so that every run of the experiment caps at the same rate
MEASURED: dict[str, Any] = {
    "rate": "33mbit", "paper_params": 20040000.0, "paper_dense_transfer_s": 2.138, "paper_batch_s": 0.58,
    "ratio": 3.686, "cnn_params": 421642, "cnn_dense_mbit": 13.493, "cnn_batch_one_core_s": 0.0553,
    "cnn_batch_s": 0.1107, "nodes": 4, "cores": 2, "rate_mbit": 33.08, "measured": "2026-11-24 00:29 UTC",
}


def batch_seconds(nodes: int) -> tuple[float, float]:
    """(seconds of one training batch of the CNN on one core, measured here; the same with
    ``nodes`` workers sharing this machine's cores, as they do in every run)."""
    import torch
    import torch.nn.functional as F

    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    torch.set_num_threads(1)
    train = fashion_mnist(True)
    model = build_model("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(25):
        x, y = train.images[64 * i:64 * i + 64], train.labels[64 * i:64 * i + 64]
        began = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - began)
    one = statistics.median(times[5:])
    return one, one * max(1.0, nodes / (os.cpu_count() or 1))


def measure(nodes: int) -> dict[str, Any]:
    """The rate, measured now, with every number of its arithmetic (``rate``: a tc rate)."""
    from p2pnode.models import build_model

    params = sum(p.numel() for p in build_model("cnn").parameters())
    paper_transfer = PAPER_PARAMS * 32 / PAPER_LINK_BITS
    ratio = paper_transfer / PAPER_BATCH_S
    one_core, shared = batch_seconds(nodes)
    bits = params * 32
    rate_mbit = bits / (ratio * shared) / 1e6
    return {"rate": f"{max(1, round(rate_mbit))}mbit", "paper_params": PAPER_PARAMS,
            "paper_dense_transfer_s": round(paper_transfer, 3), "paper_batch_s": PAPER_BATCH_S,
            "ratio": round(ratio, 3), "cnn_params": params, "cnn_dense_mbit": round(bits / 1e6, 3),
            "cnn_batch_one_core_s": round(one_core, 4), "cnn_batch_s": round(shared, 4), "nodes": nodes,
            "cores": os.cpu_count(), "rate_mbit": round(rate_mbit, 2),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
