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

Only for models under ``WHOLE_BELOW`` (64 MiB of float32, 16.7M parameters): a big model's whole
copies cost more than the rule gains. The GPT-2-shaped example (110M parameters, AdamW, 4 nodes
on one 23 GiB machine) peaked at 6.8-7.8 GB a node with them, against 4.9-5.3 GB with top-10 %
copies, and was stopped by the memory floor at step 8 of 12; whether whole copies learn better at
that size was not measured.

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
#: models of at least this many parameters keep gossip's sparse copies (64 MiB of float32:
#: where a model's public copy goes to a file, wire/public_file.py)
WHOLE_BELOW = 16 * 1024 * 1024


def applies(cfg: Config, adaptive: bool, params: int) -> bool:
    """Whether the rule changes anything for this node: gossip (not DiLoCo's rounds, which
    are their own recipe), an adaptive optimizer, a model of fewer than WHOLE_BELOW
    parameters, and the setting on."""
    return (adaptive and 0 < params < WHOLE_BELOW and cfg.exchange.adaptive_gossip == "auto"
            and choose(cfg).name == "gossip" and cfg.training.outer == "none")


def publish_spec(cfg: Config, adaptive: bool, params: int) -> str:
    """The sparsifier the worker publishes with (``compression.publish``, or WHOLE)."""
    if applies(cfg, adaptive, params) and cfg.compression.publish == CompressionConfig().publish:
        return WHOLE
    return cfg.compression.publish


def peers_per_round(cfg: Config, adaptive: bool, params: int) -> int:
    """The peers a gossip round fetches (``exchange.peers_per_round``, or PEERS)."""
    if applies(cfg, adaptive, params) and cfg.exchange.peers_per_round == ExchangeConfig().peers_per_round:
        return PEERS
    return cfg.exchange.peers_per_round


def said(cfg: Config, adaptive: bool, params: int) -> str | None:
    """One line for the log and status when the rule is in force; None when it is not."""
    if not applies(cfg, adaptive, params):
        return None
    return (f"the optimizer is adaptive: gossip publishes {publish_spec(cfg, adaptive, params)} in "
            f"{cfg.compression.value_dtype} and fetches {peers_per_round(cfg, adaptive, params)} peers a round "
            "(exchange.adaptive_gossip = \"auto\")")
