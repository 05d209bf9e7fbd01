"""Which way a node trains with the others, from its configuration alone: ``exchange.sync =
"auto"`` (the default) resolved to gossip or the synchronous mode, and why.

Every input is what each node of a cluster configured alike knows equally before it starts, so
all of them pick the same mode; nothing measured at run time switches it (a cluster half in one
mode and half in the other would not train together). The rule follows what was measured
(docs/BENCHMARKS.md; docs/ALGORITHMS.md, "Gossip or the synchronous mode"):

- the synchronous mode learnt better than gossip in every case measured in a cluster of
  machines one runs: even shards (90.35 % against 89.48 %, DDP 90.10 %), a node killed (89.61
  against 89.43), Dirichlet 0.1 (87.49 against 84.4-84.8, DDP 88.39), AdamW on a regression
  task (0.005 R^2 under the all-reduce reference against 0.033, five seeds), 8 nodes (within
  0.31 pt of DDP where gossip lost 1.1-5.5);
- but its reducer is the member with the lowest id, and a member chooses its id: without a
  cluster secret any host that joins could answer every node's step. Gossip trusts no member
  (robust averaging), so a node without a secret runs gossip. It is also cheaper in bytes
  (53 MB against 152 MB) and does not wait for the network; an explicit ``exchange.sync =
  "none"`` picks it where those matter more;
- one reducer carries every other node's factors, and the mode was measured up to 8 nodes
  ("Eight nodes"); where ``training.min_peers`` says the cluster is larger, "auto" does not
  pick it for you (``exchange.sync = "powersgd"`` still does);
- ``training.outer`` asks for DiLoCo's rounds, which are gossip's (the checks refuse it with
  the synchronous mode).

What only the worker knows, the task's optimizer and its shard's labels, is no input: each node
would judge from its own shard and they could pick apart, and the worker is up only after the
mode is built. Status reports them beside the choice, with the advice they call for (``status``).

torch-free: the daemon, the config checks and the worker all read it (``sync_of``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from p2pnode.config.schema import Config
from p2pnode.partition import UNLIKE, distance

#: the largest cluster the synchronous mode was measured at (docs/BENCHMARKS.md, "Eight
#: nodes": within 0.31 pt of DDP, 1.1-1.5x its time on one machine); "auto" picks it up to here
AUTO_SYNC_MAX_NODES = 8

#: why a mode was picked, one word each (``ModeChoice.rule``; docs/ALGORITHMS.md's table has a
#: row for every one: tests/test_mode_table.py)
RULES = ("role", "set", "no-secret", "outer", "size", "trusted")


@dataclass(frozen=True)
class ModeChoice:
    #: "gossip", "powersgd" (the synchronous mode), "ps" or "ps-worker"
    name: str
    #: what ``exchange.sync`` resolves to: the synchronous mode's or none
    sync: Literal["none", "powersgd"]
    #: ``exchange.sync`` as configured: "auto", "none" or "powersgd"
    setting: str
    #: which case of the rule (one of RULES)
    rule: str
    #: the reason, for status and the log
    why: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "setting": self.setting, "why": self.why}


def trusted(cfg: Config) -> bool:
    """A cluster secret is configured (every request signed: only holders of it are members)."""
    return bool(cfg.node.secret or cfg.node.secret_file)


def choose(cfg: Config) -> ModeChoice:
    """The mode ``cfg`` runs, and why (an explicit ``exchange.sync`` always wins)."""
    setting, role = cfg.exchange.sync, cfg.node.role
    if role != "peer":
        return ModeChoice(role, "none", setting, "role", f"node.role = {role}: the parameter server's own mode")
    if setting == "none":
        return ModeChoice("gossip", "none", setting, "set", "exchange.sync = \"none\" set")
    if setting == "powersgd":
        return ModeChoice("powersgd", "powersgd", setting, "set", "exchange.sync = \"powersgd\" set")
    if not trusted(cfg):
        return ModeChoice("gossip", "none", setting, "no-secret",
                          "no cluster secret: the synchronous mode's reducer is the member with the lowest id, "
                          "which any host that joins could take; gossip trusts no member")
    if cfg.training.outer != "none":
        return ModeChoice("gossip", "none", setting, "outer",
                          f"training.outer = {cfg.training.outer}: DiLoCo's rounds are gossip's")
    nodes = cfg.training.min_peers + 1
    if nodes > AUTO_SYNC_MAX_NODES:
        return ModeChoice("gossip", "none", setting, "size",
                          f"training.min_peers = {cfg.training.min_peers}: {nodes} nodes or more, over the "
                          f"{AUTO_SYNC_MAX_NODES} the synchronous mode's one reducer was measured at")
    return ModeChoice("powersgd", "powersgd", setting, "trusted",
                      "a cluster secret (machines you run): the synchronous mode learnt better than gossip in "
                      "every case measured (even and skewed shards, a node killed, AdamW)")


def sync_of(cfg: Config) -> Literal["none", "powersgd"]:
    """``exchange.sync`` resolved: what the daemon and the worker run."""
    return choose(cfg).sync


def remedy(choice: ModeChoice) -> str | None:
    """For a gossip node: what would give it the synchronous mode (None: it is not gossip, or
    "auto" kept it from the synchronous mode for a reason a secret does not change)."""
    if choice.name != "gossip":
        return None
    if choice.rule == "no-secret":
        return ("give every node a cluster secret (node.secret_file) and exchange.sync = \"auto\" picks the "
                "synchronous mode")
    if choice.rule == "set":
        return "among machines you run, behind the cluster secret, exchange.sync = \"auto\" or \"powersgd\""
    return None


#: what was measured, for the advice below (docs/BENCHMARKS.md)
ADAPTIVE_MEASURED = ("in gossip, even with whole copies from two peers a round (exchange.adaptive_gossip), a "
                     "cluster with it measured far from an all-reduce of gradients (3 nodes, five seeds: a "
                     "regression task 0.019 R^2 under it, the synchronous mode 0.003; a byte LM 0.97 perplexity "
                     "over it, the synchronous mode 0.12)")
SKEW_MEASURED = "gossip ends 3-8 points under all-reduce on skewed labels, the synchronous mode within 0.5"


def label_skew(classes: list[int]) -> float | None:
    """How far a shard's labels are from an even mix of its task's classes (total variation;
    0: even, towards 1: one class); None where the task lists no classes."""
    return distance(classes, [[1] * len(classes)]) if classes else None


def advice(choice: ModeChoice, optimizer: str, adaptive: bool, skew: float | None) -> str | None:
    """A line for the operator of a gossip node whose task gossip was measured to learn badly
    (an adaptive optimizer, labels far from an even mix), saying what would pick the synchronous
    mode; None where there is nothing to say or nothing a setting of ours would change."""
    fix = remedy(choice)
    reasons = []
    if adaptive:
        reasons.append(f"the optimizer {optimizer} adapts each coordinate's step: {ADAPTIVE_MEASURED}")
    if skew is not None and skew > UNLIKE:
        reasons.append(f"this node's labels are {skew:.2f} from an even mix (total variation): {SKEW_MEASURED}")
    if fix is None or not reasons:
        return None
    return "; ".join(reasons) + "; " + fix + " (docs/ALGORITHMS.md, \"Gossip or the synchronous mode\")"


def status(choice: ModeChoice, optimizer: str, adaptive: bool, classes: list[int]) -> dict[str, object]:
    """status["mode"]: the mode, the setting, why, and beside them what only the worker knows
    (the optimizer, this shard's label skew) with the advice they call for."""
    skew = label_skew(classes)
    return {**choice.to_json(), "optimizer": optimizer or None, "adaptive": adaptive,
            "label_skew": None if skew is None else round(skew, 3),
            "advice": advice(choice, optimizer, adaptive, skew)}
