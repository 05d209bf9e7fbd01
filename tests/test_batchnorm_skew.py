"""A node whose model has BatchNorm layers and whose shard's labels are skewed says once in its
log what that costs (p2pnode/worker/batchnorm.py ``skew_warning``): each node normalises its
batches with its own classes' statistics, which no averaging undoes. Real trainers on
``bn_task:blobs``: a Dirichlet 0.1 shard gets the line, an even shard does not."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from p2pnode.config import Config
from p2pnode.worker.batchnorm import skew_warning
from p2pnode.worker.training import ShardTrainer

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("partition", ["dirichlet:alpha=0.1", "iid"])
def test_a_batchnorm_model_on_a_skewed_shard_is_told_once(partition: str, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    with caplog.at_level(logging.WARNING, logger="p2pnode.worker"):
        t = ShardTrainer(Config.from_dict({"training": {"task": "bn_task:blobs", "device": "cpu", "shard": "0/3",
                                                        "partition": partition, "seed": 3}}))
    said = [r.getMessage() for r in caplog.records if "BatchNorm layers" in r.getMessage()]
    if partition == "iid":
        assert said == [] and t.advise_batchnorm() is None
    else:
        assert len(said) == 1 and "the model has 1 BatchNorm layers" in said[0], said
        assert "GroupNorm" in said[0] and "from an even mix" in said[0]


def test_nothing_to_say_without_batchnorm_or_skew() -> None:
    assert skew_warning(0, 0.9, 0.2) is None  # no BatchNorm layer
    assert skew_warning(3, 0.1, 0.2) is None  # labels near an even mix
    assert skew_warning(3, None, 0.2) is None  # a task without classes
    assert skew_warning(3, 0.9, 0.2) is not None
