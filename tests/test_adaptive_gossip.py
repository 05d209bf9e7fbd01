"""Gossip for a task whose optimizer is adaptive (p2pnode/config/adaptive_gossip.py,
``exchange.adaptive_gossip``): every entry published and two peers a round where those settings
are left at their defaults; a setting made by hand, the synchronous mode, DiLoCo's rounds, an
SGD task and a model of ``WHOLE_BELOW`` parameters or more keep what they had. Then two real daemons training a task with AdamW in gossip
publish whole copies and say so in status."""

from __future__ import annotations

import pytest
from nodes import wait_for

from benchlib.cluster import finished
from p2pnode.config import Config, set_option, validate
from p2pnode.config.adaptive_gossip import PEERS, WHOLE, WHOLE_BELOW, peers_per_round, publish_spec, said


def cfg_with(**settings: str) -> Config:
    cfg = Config()
    for key, value in settings.items():
        set_option(cfg, key.replace("__", "."), value)
    validate(cfg)
    return cfg


SMALL = 75_000  # the regression task's parameters


@pytest.mark.parametrize("settings, adaptive, publish, peers", [
    ({}, True, WHOLE, PEERS),  # gossip (no secret), AdamW: the rule
    ({}, False, "topk:density=0.1", 1),  # SGD: as it was
    ({"exchange__adaptive_gossip": "off"}, True, "topk:density=0.1", 1),
    ({"compression__publish": "topk:density=0.3"}, True, "topk:density=0.3", PEERS),  # theirs wins
    ({"exchange__peers_per_round": "3"}, True, WHOLE, 3),
    ({"node__secret": "s" * 32}, True, "topk:density=0.1", 1),  # the synchronous mode ("auto")
    ({"exchange__sync": "powersgd"}, True, "topk:density=0.1", 1),
    ({"training__outer": "nesterov", "exchange__robust": "none", "compression__publish_on": "steps"},
     True, "topk:density=0.1", 1),  # DiLoCo's rounds: their own recipe
])
def test_the_rule(settings: dict[str, str], adaptive: bool, publish: str, peers: int) -> None:
    cfg = cfg_with(**settings)
    assert publish_spec(cfg, adaptive, SMALL) == publish
    assert peers_per_round(cfg, adaptive, SMALL) == peers
    assert (said(cfg, adaptive, SMALL) is not None) == (publish == WHOLE or peers == PEERS)


def test_a_big_model_keeps_sparse_copies() -> None:
    """From WHOLE_BELOW parameters (64 MiB of float32) on, whole copies cost a gossip node more
    memory than the machine had (the GPT-2-shaped example, 4 nodes: stopped by the memory
    floor); before the worker's hello (0 parameters known) nothing changes either."""
    cfg = Config()
    for params in (WHOLE_BELOW, 110_000_000, 0):
        assert publish_spec(cfg, True, params) == "topk:density=0.1" and peers_per_round(cfg, True, params) == 1
        assert said(cfg, True, params) is None
    assert publish_spec(cfg, True, WHOLE_BELOW - 1) == WHOLE


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_adamw_nodes_in_gossip_publish_whole_copies(cluster) -> None:
    run = ["--set", "training.task=benchlib.tasks.regression:task", "--set", "task.items=1024",
           "--set", "training.lr=0.003", "--set", "training.max_samples=1280", "--set", "training.eval_every=0"]
    a = cluster("a", extra=[*run, "--shard", "0/2"])
    a.wait_ready(90)
    b = cluster("b", seeds=[a.addr], extra=[*run, "--shard", "1/2"])
    b.wait_ready(90)
    wait_for(lambda: all(finished(n.status()) for n in (a, b)), 150, "both nodes done")
    for n in (a, b):
        s = n.status()
        assert s["mode"]["name"] == "gossip" and s["mode"]["adaptive"], s["mode"]
        assert s["config"]["publish"] == WHOLE and s["config"]["peers_per_round"] == PEERS, s["config"]
        assert "publishes topk:density=1.0" in (s["mode"]["adaptive_gossip"] or ""), s["mode"]
        assert s["exchanges"]["done"] >= 2, s["exchanges"]
        # what is served is every entry: a delta of about a byte and an index gap each, where a
        # top-10 % one was a tenth of that
        params = s["training"]["params"]
        log = s["served_model"]
        assert log["log_entries"] >= 1 and log["log_bytes"] / log["log_entries"] > 0.5 * params, (log, params)
    assert "the optimizer is adaptive: gossip publishes" in a.log()
