"""What gossip publishes and fetches for a task whose optimizer is adaptive
(``exchange.adaptive_gossip``): one pure, torch-free rule, read by the worker (what it publishes)
and the daemon (how many peers a round), from the settings and the worker's own optimizer.

Why: an adaptive optimizer (AdamW, Adam...) moves every coordinate by about the learning rate
each step, so the residual x - x̂ a top-10 % publish chooses from is spread over every entry and
the public copy lags far behind the model; averaged with one such copy a round, a gossip cluster
ended barely above one node alone (a regression task) or below it (a byte-level language model).
Every entry in int8 from every peer, the same four steps apart, is what a lockstep study of the
regression found to matter (scripts/study_adam.py: sparse copies from every peer ended where one
peer's did, whole copies from one peer little better; whole copies from every peer near the
exact mean of the models) and what the daemons measured (docs/BENCHMARKS.md, "Gossip and an
adaptive optimizer": over five seeds the gap to all-reduce halved on both AdamW tasks, and a byte
LM that ended below a node alone on every seed beat it on four). It costs bytes: 7-9x what one
peer's top-10 % copy cost, about what the synchronous mode sends in int8. It does not reach the
synchronous mode, which averages gradients: with a cluster secret "auto" picks that mode.

A setting made by hand wins: a ``compression.publish`` or ``exchange.peers_per_round`` that is
not the default is kept as it is, and ``exchange.adaptive_gossip = "off"`` keeps both.
"""

from __future__ import annotations

from p2pnode.config.mode_rule import choose
from p2pnode.config.schema import CompressionConfig, Config, ExchangeConfig

#: what an adaptive optimizer's gossip publishes: every entry (in compression.value_dtype)
WHOLE = "topk:density=1.0"
#: peers fetched a round (at most the peers there are): every other node of the three-node
#: clusters it was measured on
PEERS = 2


def applies(cfg: Config, adaptive: bool) -> bool:
    """Whether the rule changes anything for this node: gossip (not DiLoCo's rounds, which
    are their own recipe), an adaptive optimizer, and the setting on."""
    return (adaptive and cfg.exchange.adaptive_gossip == "auto" and choose(cfg).name == "gossip"
            and cfg.training.outer == "none")


def publish_spec(cfg: Config, adaptive: bool) -> str:
    """The sparsifier the worker publishes with (``compression.publish``, or WHOLE)."""
    if applies(cfg, adaptive) and cfg.compression.publish == CompressionConfig().publish:
        return WHOLE
    return cfg.compression.publish


def peers_per_round(cfg: Config, adaptive: bool) -> int:
    """The peers a gossip round fetches (``exchange.peers_per_round``, or PEERS)."""
    if applies(cfg, adaptive) and cfg.exchange.peers_per_round == ExchangeConfig().peers_per_round:
        return PEERS
    return cfg.exchange.peers_per_round


def said(cfg: Config, adaptive: bool) -> str | None:
    """One line for the log and status when the rule is in force; None when it is not."""
    if not applies(cfg, adaptive):
        return None
    return (f"the optimizer is adaptive: gossip publishes {publish_spec(cfg, adaptive)} in "
            f"{cfg.compression.value_dtype} and fetches {peers_per_round(cfg, adaptive)} peers a round "
            "(exchange.adaptive_gossip = \"auto\")")
