"""The benchmark's DDP anchor (benchlib/ddp.py) can draw exactly the batches p2pnode's nodes draw,
so that a scenario's two systems differ only in how they average (bench_scenarios --ddp-order)."""

from __future__ import annotations

import itertools

import torch

from benchlib.ddp import BATCH, DdpRun, batch_stream, batch_stream_seed
from p2pnode.tasks.loader import EndlessBatches
from p2pnode.worker.training import batch_seed


def test_ddp_in_p2pnode_order_draws_a_node_s_batches_across_passes() -> None:
    size = 5 * BATCH + 17  # a short tail skipped at every pass
    for seed, rank in [(0, 0), (1, 3), (7, 2)]:
        run = DdpRun(seed=seed, order="p2pnode")
        ours = [b.tolist() for b in itertools.islice(batch_stream(size, batch_stream_seed(run, rank)), 12)]
        node = list(itertools.islice(iter(EndlessBatches(size, BATCH, torch.Generator().manual_seed(
            batch_seed(seed, rank)))), 12))
        assert ours == node
    # its own order is another stream (the anchor's figures of earlier rounds), one per rank
    own = [batch_stream_seed(DdpRun(seed=1), r) for r in range(4)]
    assert len(set(own)) == 4 and batch_stream_seed(DdpRun(seed=1, order="p2pnode"), 0) not in own
