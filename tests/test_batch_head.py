"""``loader.head``: the first k items of a batch of any structure a task may yield (the
synchronous mode's ``exchange.sync_keep_pace`` trains a slower node on a part of each batch)."""

from __future__ import annotations

from collections import namedtuple

import torch

from p2pnode.sync.lateness import Lateness
from p2pnode.tasks import loader


def test_every_tensor_of_the_batch_is_cut_and_nothing_else() -> None:
    x, y, w = torch.arange(20).view(10, 2), torch.arange(10), torch.ones(3)  # w: not a per-item tensor
    assert [t.tolist() for t in loader.head((x, y), 4)] == [x[:4].tolist(), y[:4].tolist()]
    cut = loader.head({"input": x, "target": [y, w], "name": "batch"}, 3)
    assert cut["input"].shape == (3, 2) and cut["target"][0].tolist() == [0, 1, 2]
    assert cut["target"][1].shape == (3,) and torch.equal(cut["target"][1], w) and cut["name"] == "batch"
    Pair = namedtuple("Pair", "x y")
    pair = loader.head(Pair(x, y), 2)
    assert isinstance(pair, Pair) and pair.y.tolist() == [0, 1]
    assert loader.batch_len(loader.head(x, 10)) == 10


def test_the_pace_a_node_is_asked_to_keep_is_the_median_of_the_others() -> None:
    late = Lateness()
    assert late.pace("a") == 0.0  # nothing known yet
    for _ in range(10):
        for node, took in (("a", 0.2), ("b", 0.05), ("c", 0.06), ("d", 0.07)):
            late.came(node, took)
    assert abs(late.pace("a") - 0.06) < 1e-9  # its own time is not in it
    assert abs(late.pace("b", running={"a", "b", "c"}) - 0.13) < 1e-9  # only the running ones'
