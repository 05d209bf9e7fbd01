"""Where peer-to-peer is actually used: each node's own (skewed) data, thin links, a slow node, a
node dying. For every scenario, in one invocation and the same hour: PyTorch DDP (gloo) on
exactly the same shards, then p2pnode with the settings given (every setting printed with the
table). 4 nodes, the small CNN, Fashion-MNIST, the same samples per node and cosine schedule for
both systems.

    .venv/bin/python scripts/bench_scenarios.py                         # every scenario
    .venv/bin/python scripts/bench_scenarios.py --scenarios dir0.1 dir0.5 --variants defaults qgm
    .venv/bin/python scripts/bench_scenarios.py --repeat 3 --jsonl run/scenarios.jsonl --write

Scenarios: ``iid`` (interleaved shards), ``dir0.5`` / ``dir0.1`` (per-class proportions from
Dirichlet(alpha)), ``classes2`` (2 chunks of label-sorted data per node), ``thin25`` (every link
at 25 Mbit/s: network namespaces and tc tbf, root only), ``lan100`` / ``lan1g`` (every link at
100 Mbit/s or 1 Gbit/s: an office's or a rack's ordinary wired links), ``thin-reducer`` / ``thin-other`` (one
link alone at 25 Mbit/s: the synchronous mode's reducer's, or another node's), ``straggler`` (node 3 at half speed:
SIGSTOP/SIGCONT duty cycle; DDP's rank 3 the same), ``straggler-reducer`` (the same, but the
node at half speed is the one with the lowest id: the synchronous mode's reducer), ``kill`` (node 3 SIGKILLed half-way and
restarted on its state; DDP's rank 3 killed at the same step: DDP cannot go on). The partition
seed is the same for both systems; ``--seed`` (repeat r: seed + r) is DDP's initial model and
batch orders and p2pnode's ``training.seed``, so repeats sample both systems (DDP is deterministic
per seed; three DDP runs of one seed would be one draw). Per scenario and system: per-node accuracy of the final
model on the 10 000 test images (min / median / max), spread, bytes sent, training wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib.cluster import ROOT, Cluster, TrainResult, loopback, node_ids, train
from benchlib.ddp import DdpRun, run_ddp
from benchlib.netns import Topology, unavailable
from benchlib.paired import ddp_run_name
from benchlib.procs import DutyCycle
from benchlib.results import add_output_args, append_jsonl, command_line, machine, table, write_section

SECTION = "## Scenarios: skewed data, thin links, a straggler, a node dying (p2pnode and DDP)"


@dataclass
class Scenario:
    name: str
    what: str
    partition: str = "iid"
    rate: str = ""  #: every link limited to this (netns + tc tbf)
    #: with ``rate``: only this node's link is limited (node 0 holds the lowest id, the synchronous
    #: mode's reducer; DDP's ring is as slow as its slowest link whichever rank holds it)
    thin_node: int | None = None
    straggler: bool = False  #: node 3 at half speed
    #: with ``straggler``: the node at half speed is the one with the lowest id instead (the
    #: synchronous mode's reducer; DDP's rank 3 all the same: it waits for any rank)
    slow_reducer: bool = False
    kill: bool = False  #: node 3 SIGKILLed half-way, then restarted
    #: with ``kill``: the node killed is the one with the lowest id (the synchronous mode's reducer)
    kill_reducer: bool = False
    #: with ``kill``: restarted this many seconds later (negative: it stays dead, the others go
    #: on without it; 10 s: after membership has called it dead)
    restart_after: float = 2.0
    #: node 0, every other node's seed, holds the lowest id (the synchronous mode's reducer)
    seed_reduces: bool = False


SCENARIOS = {s.name: s for s in [
    Scenario("iid", "even interleaved shards"),
    Scenario("dir0.5", "label skew, Dirichlet alpha 0.5", "dirichlet:alpha=0.5"),
    Scenario("dir0.1", "label skew, Dirichlet alpha 0.1", "dirichlet:alpha=0.1"),
    Scenario("classes2", "2 label-sorted chunks per node", "classes:k=2"),
    Scenario("thin25", "every link 25 Mbit/s, even shards", rate="25mbit"),
    Scenario("lan100", "every link 100 Mbit/s, even shards", rate="100mbit"),
    Scenario("lan1g", "every link 1 Gbit/s (an ordinary wired LAN), even shards", rate="1gbit"),
    Scenario("thin-reducer", "the reducer's link alone at 25 Mbit/s (node 0, the lowest id), even shards",
             rate="25mbit", thin_node=0, seed_reduces=True),
    Scenario("thin-other", "node 3's link alone at 25 Mbit/s (node 0 reduces), even shards", rate="25mbit",
             thin_node=3, seed_reduces=True),
    Scenario("straggler", "node 3 at half speed, even shards", straggler=True),
    Scenario("straggler-dir0.1", "node 3 at half speed, label skew Dirichlet alpha 0.1 (its classes are its own)",
             "dirichlet:alpha=0.1", straggler=True),
    Scenario("straggler-reducer", "the node with the lowest id at half speed, even shards", straggler=True,
             slow_reducer=True),
    Scenario("kill", "node 3 SIGKILLed half-way and restarted, even shards", kill=True),
    Scenario("kill-stay", "node 3 SIGKILLed half-way, not restarted, even shards", kill=True, restart_after=-1),
    Scenario("kill-reducer-stay", "the node with the lowest id SIGKILLed half-way, not restarted, even shards",
             kill=True, kill_reducer=True, restart_after=-1),
    Scenario("kill-reducer-late", "the node with the lowest id SIGKILLed half-way, restarted 10 s later (called dead "
             "by then), even shards", kill=True, kill_reducer=True, restart_after=10.0),
    Scenario("kill-seed-late", "node 0 (every node's seed, and the reducer: the lowest id) SIGKILLed half-way, "
             "restarted 10 s later, even shards", kill=True, kill_reducer=True, restart_after=10.0, seed_reduces=True),
    Scenario("kill-reducer", "the node with the lowest id SIGKILLed half-way and restarted, even shards", kill=True,
             kill_reducer=True),
]}


def lean(every: int, density: float, ring: bool = True, finish: float = 0.0) -> list[str]:
    """The DiLoCo row's settings (the goal: 1/300 of DDP's bytes): rounds of ``every`` steps with
    ``density`` of the change a publish, one peer a node (a ring: one first fetch each) unless
    ``ring`` is off, no start from a peer's model (every node builds the same seeded one), and
    no consensus finish unless ``finish`` (its tolerance): every node ends on its own last model."""
    return ["--set", f"exchange.every={every}", "--set", f"compression.publish_every={every}",
            "--set", f"compression.publish=topk:density={density}",
            *(["--set", "exchange.peer_selection=ring"] if ring else []),
            "--set", f"exchange.consensus_tolerance={finish:g}", "--set", "membership.bootstrap_from_peer=false"]


def powersgd(rank: int, values: str = "", min_peers: int = 3) -> list[str]:
    """The synchronous mode's settings: PowerSGD at ``rank``, its factors in ``values`` (the
    package default when empty), each node waiting for ``min_peers`` others before its first step."""
    return ["--set", "exchange.sync=powersgd", "--set", f"exchange.sync_rank={rank}",
            *(["--set", f"exchange.sync_values={values}"] if values else []), "--set", f"training.min_peers={min_peers}"]


#: p2pnode settings under test; every one is printed with the table
VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    # synchronous PowerSGD every step (exchange.sync: no gossip beside it, every node applies
    # the same mean gradient to the same seeded model), the nodes starting together
    **{f"sync{r}": powersgd(r) for r in (4, 6, 7, 8)},
    # int8 factors (one byte a value, blocks of 64 with a float32 scale each; exchange.sync_values):
    # rank 6 at about half sync6's bytes, rank 12 at about the same; 24 (over the goal's byte
    # budget) to tell whether the rank is what the skewed shards' remaining gap is made of
    **{f"sync{r}-i8": powersgd(r, "int8") for r in (6, 12, 24)},
    # int4 (half a byte a value, the same blocks): rank 24 at about sync12-i8's bytes
    "sync24-i4": powersgd(24, "int4"),
    # the same for 8 nodes (--nodes 8): every node waits for the 7 others before its first step
    "sync24-i4-n8": powersgd(24, "int4", min_peers=7),
    # no factoring at all: every tensor whole in int8 blocks, its rounding owed (a rank no matrix
    # of the small CNN reaches): DDP's mean but for int8 rounding, ~11x sync12-i8's bytes; to tell
    # the daemon's pipeline from PowerSGD's approximation
    "sync-whole-i8": powersgd(100000, "int8"),
    # a slower node trains on a part of each batch to keep the others' pace (exchange.sync_keep_pace)
    "sync6-pace": [*powersgd(6), "--set", "exchange.sync_keep_pace=true"],
    # every node waited for every step, a slow one too, as DDP (exchange.sync_wait_for_slow)
    "sync6-wait": [*powersgd(6), "--set", "exchange.sync_wait_for_slow=always"],
    # a slow node never waited for, whatever its data (the default before "auto")
    "sync6-drop": [*powersgd(6), "--set", "exchange.sync_wait_for_slow=never"],
    "qgm": ["--set", "training.optimizer=qgm"],
    "ring": ["--set", "exchange.peer_selection=ring"],
    "qgm-ring": ["--set", "training.optimizer=qgm", "--set", "exchange.peer_selection=ring"],
    "clip": ["--set", "training.grad_clip=5"],  # the default since it was measured
    "noclip": ["--set", "training.grad_clip=0"],
    "clip-ring": ["--set", "training.grad_clip=5", "--set", "exchange.peer_selection=ring"],
    "clip-every2": ["--set", "training.grad_clip=5", "--set", "exchange.every=2", "--set", "compression.publish_every=2",
                    "--set", "compression.publish=topk:density=0.05"],
    "qgm-clip": ["--set", "training.optimizer=qgm", "--set", "training.grad_clip=5"],
    # robust averaging (self-centred clipping of peers' models) on, the default, and off
    "robust-clip": ["--set", "exchange.robust=clip"],
    "robust-none": ["--set", "exchange.robust=none"],
    # a start together: a fresh node's first step waits until it sees the other 3 of the 4 nodes
    # (training.min_peers; what a user sets to the cluster's size less one, as DDP's world size)
    "together": ["--set", "training.min_peers=3"],
    # DiLoCo over gossip: rounds of 50 local steps, 5 % of the round's change on the wire. Robust
    # clipping off: after 50 local steps honest models are far apart, and with it on every round's
    # model was refused as an outlier (measured: 1-2 exchanges of 28 per node taken)
    "diloco50": ["--set", "training.outer=nesterov", "--set", "exchange.every=50", "--set", "compression.publish_every=50",
                 "--set", "compression.publish=topk:density=0.05", "--set", "compression.value_dtype=float16",
                 "--set", "exchange.robust=none", "--set", "compression.publish_on=steps"],
    "diloco25": ["--set", "training.outer=nesterov", "--set", "exchange.every=25", "--set", "compression.publish_every=25",
                 "--set", "compression.publish=topk:density=0.05", "--set", "exchange.robust=none",
                 "--set", "compression.publish_on=steps"],
    "diloco16": ["--set", "training.outer=nesterov", "--set", "exchange.every=16", "--set", "compression.publish_every=16",
                 "--set", "compression.publish=topk:density=0.05", "--set", "exchange.robust=none",
                 "--set", "compression.publish_on=steps"],
    # plain gossip at DiLoCo's bytes: a fetch every 16 steps, 5 % a publish
    "every16-d05": ["--set", "exchange.every=16", "--set", "compression.publish_every=16",
                    "--set", "compression.publish=topk:density=0.05"],
    # the DiLoCo row's bytes (the goal: 1/300 of DDP's): long rounds, one peer each (a ring: one
    # first-fetch snapshot a node), no start from a peer's model (every node builds the same
    # seeded one), no consensus finish: every node ends on its own model of the last round
    # (named by the density's digits: ring16-d02-lean is rounds of 16 steps, 2 % a publish)
    **{f"ring{every}-d{str(density)[2:]}-lean": lean(every, density) for every, density in
       [(64, 0.05), (32, 0.05), (16, 0.05), (8, 0.02), (12, 0.02), (16, 0.02), (8, 0.015), (24, 0.02), (32, 0.02),
        (64, 0.02), (64, 0.01), (64, 0.015)]},
    "ring64-d05-lean-nolead": [*lean(64, 0.05), "--set", "exchange.max_lead=0"],
    "exp32-d05-lean": lean(32, 0.05, ring=False),
    "exp8-d02-lean": lean(8, 0.02, ring=False),
    "ring32-d05-fin05": lean(32, 0.05, finish=0.05),
    "diloco64-ring-lean": ["--set", "training.outer=nesterov", "--set", "exchange.robust=none",
                           "--set", "compression.publish_on=steps", *lean(64, 0.05)],
    "diloco16-ring-d02-lean": ["--set", "training.outer=nesterov", "--set", "exchange.robust=none",
                               "--set", "compression.publish_on=steps", *lean(16, 0.02)],
    # a bounded lead (exchange.max_lead): a node this many steps ahead of most of its peers waits
    "lead0": ["--set", "exchange.max_lead=0"],  # the defaults before the bounded lead (2026-11-25)
    "lead4": ["--set", "exchange.max_lead=4"],
    "lead8": ["--set", "exchange.max_lead=8"],
    # quasi-global momentum with the nodes held closer in step (it lost 2 pt when they ran apart)
    "qgm-lead4": ["--set", "training.optimizer=qgm", "--set", "exchange.max_lead=4"],
    # every peer (3 of 3 at 4 nodes) a round, averaged uniformly (each payload of a round weighs
    # 1/(n+1) as it lands), at half the density so the bytes stay within 1/30 of DDP's
    "ppr3-d05": ["--set", "exchange.peers_per_round=3", "--set", "compression.publish=topk:density=0.05"],
    # the same, published every 4 steps (all peers fetch one copy, as the study's group mix), not on fetch
    "ppr3-d05-steps": ["--set", "exchange.peers_per_round=3", "--set", "compression.publish=topk:density=0.05",
                       "--set", "compression.publish_on=steps"],
    "ppr3-d05-norobust": ["--set", "exchange.peers_per_round=3", "--set", "compression.publish=topk:density=0.05",
                          "--set", "exchange.robust=none"],
    "ppr3": ["--set", "exchange.peers_per_round=3"],
    "ppr2": ["--set", "exchange.peers_per_round=2"],
    # the next round's fetch may start while the last payload waits for the worker
    "pipeline": ["--set", "exchange.pipeline=true"],
    # a smaller step: local steps drift less on skewed shards, the network's mean moves slower
    "lr0.1": ["--set", "training.lr=0.1"],
    "lr0.05": ["--set", "training.lr=0.05"],
    "fp16": ["--set", "compression.value_dtype=float16"],
    "fp32": ["--set", "compression.value_dtype=float32"],
    # the defaults before publish_on = fetch and int8 values (2026-11-24, made the defaults after
    # robust averaging's strike rule: p2pnode/worker/robust.py)
    "steps-fp32": ["--set", "compression.publish_on=steps", "--set", "compression.value_dtype=float32"],
    "steps-int8": ["--set", "compression.publish_on=steps", "--set", "compression.value_dtype=int8"],
    # a peer's fetch is answered with a fresh publish (at most a step old, not up to publish_every)
    "fresh": ["--set", "compression.publish_on=fetch"],
    "fresh-fp16": ["--set", "compression.publish_on=fetch", "--set", "compression.value_dtype=float16"],
    "fresh-int8": ["--set", "compression.publish_on=fetch", "--set", "compression.value_dtype=int8"],
    "int8": ["--set", "compression.value_dtype=int8"],
    # one steady partner: every fetch is the single newest delta, served as published (float16 values
    # stay float16; the exponential graph's fetches merge two publishes into a float32 "set" delta)
    "ring-fp16": ["--set", "exchange.peer_selection=ring", "--set", "compression.value_dtype=float16"],
    # more gossip for the same bytes: int8 values (~2 bytes an entry with its index against ~5)
    # buy exchanging twice (or four times) as often (the lockstep study: Dirichlet 0.1 +0.8 pt)
    "int8-every2": ["--set", "compression.value_dtype=int8", "--set", "exchange.every=2",
                    "--set", "compression.publish_every=2"],
    # with the defaults (publish on fetch, int8): a fetch every 3 steps, ~1.3x the bytes (within 1/30 of DDP's)
    "every3": ["--set", "exchange.every=3", "--set", "compression.publish_every=3"],
    # the HTTP layer waits min(0.5 s, exchange.timeout / 4) for a fetch's publish: 0.1 s here
    "every3-shortwait": ["--set", "exchange.every=3", "--set", "compression.publish_every=3",
                         "--set", "exchange.timeout=0.4"],
    "every3-fp32": ["--set", "exchange.every=3", "--set", "compression.publish_every=3",
                    "--set", "compression.value_dtype=float32"],
    "every3-steps": ["--set", "exchange.every=3", "--set", "compression.publish_every=3",
                     "--set", "compression.publish_on=steps"],
    "every3-norobust": ["--set", "exchange.every=3", "--set", "compression.publish_every=3",
                        "--set", "exchange.robust=none"],
    # fewer, larger exchanges for the same bytes: does the daemon lose per exchange?
    "every6-d15": ["--set", "exchange.every=6", "--set", "compression.publish_every=6",
                   "--set", "compression.publish=topk:density=0.15"],
    "every8-d20": ["--set", "exchange.every=8", "--set", "compression.publish_every=8",
                   "--set", "compression.publish=topk:density=0.2"],
    "int8-every1": ["--set", "compression.value_dtype=int8", "--set", "exchange.every=1",
                    "--set", "compression.publish_every=1"],
    # the same on a ring: every fetch is the single newest delta, served as published (int8 kept;
    # the exponential graph's fetches two publishes behind are merged into a float32 "set" delta)
    "int8-ring-every2": ["--set", "compression.value_dtype=int8", "--set", "exchange.every=2",
                         "--set", "compression.publish_every=2", "--set", "exchange.peer_selection=ring"],
    "int8-ring-every1": ["--set", "compression.value_dtype=int8", "--set", "exchange.every=1",
                         "--set", "compression.publish_every=1", "--set", "exchange.peer_selection=ring"],
    # SlowMo-like: no inner momentum, the outer Nesterov step on every exchange's pseudo-gradient
    "slowmo": ["--set", "training.momentum=0", "--set", "training.outer=nesterov", "--set", "training.outer_lr=1.0",
               "--set", "exchange.robust=none", "--set", "compression.publish_on=steps"],
    "slowmo-fp16": ["--set", "training.momentum=0", "--set", "training.outer=nesterov", "--set", "training.outer_lr=1.0",
                    "--set", "compression.value_dtype=float16", "--set", "exchange.robust=none",
                    "--set", "compression.publish_on=steps"],
}


@dataclass
class Row:
    scenario: str
    system: str
    accs: list[float] = field(default_factory=list)
    sent: float = 0.0
    seconds: float | None = None
    note: str = ""

    def add_note(self, text: str) -> None:
        """One more remark in the row's note column."""
        self.note = f"{self.note}; {text}" if self.note else text

    def cells(self) -> list[str]:
        if not self.accs:
            return [self.scenario, self.system, "-", "-", f"{self.sent / 1e6:.0f} MB" if self.sent else "-",
                    f"{self.seconds:.0f} s" if self.seconds else "-", self.note]
        accs = sorted(self.accs)
        return [self.scenario, self.system,
                " / ".join(f"{100 * a:.2f}" for a in (accs[0], statistics.median(accs), accs[-1])),
                f"{100 * (accs[-1] - accs[0]):.2f}", f"{self.sent / 1e6:.0f} MB",
                f"{self.seconds:.0f} s" if self.seconds else "-", self.note]


def run_ddp_row(sc: Scenario, args: argparse.Namespace, place: Any, topo: Topology | None, seed: int = 0) -> Row:
    run = DdpRun(workers=args.nodes, samples=args.samples, partition=sc.partition, partition_seed=args.partition_seed,
                 seed=seed, bucket_cap_mb=args.ddp_bucket_mb, order=args.ddp_order,
                 kill_at=(args.samples // 64) // 2 if sc.kill else 0, max_seconds=args.ddp_max_seconds if sc.rate else 0,
                 log_dir=str(Path(args.ddp_save).resolve() / ddp_run_name(sc.name, seed, args.partition_seed, args.ddp_order))
                 if args.ddp_save else "")
    on_start = (lambda procs: DutyCycle([procs[-1].pid], 0.5, args.slow_period)) if sc.straggler else None
    before = topo.counters()[0] if topo else 0
    env = {"GLOO_SOCKET_IFNAME": "eth0"} if topo else None
    d = run_ddp(run, place, env=env, on_start=on_start)
    sent = (topo.counters()[0] - before) if topo else float(d.get("sent", 0.0))
    row = Row(sc.name, f"DDP (gloo), seed {seed}" if args.repeat > 1 else "DDP (gloo)", sent=sent,
              seconds=d.get("seconds"))
    if args.ddp_bucket_mb != DdpRun.bucket_cap_mb:
        row.system += f", buckets of {args.ddp_bucket_mb:g} MB"
    if args.ddp_order != DdpRun.order:
        row.system += ", p2pnode's batch order"
    if "failed" in d:
        row.note = f"failed at step {d.get('steps')}/{d.get('of_steps')}: {d['failed'][:80]}"
    elif d["steps"] < d["of_steps"]:
        full = d["seconds"] * d["of_steps"] / max(1, d["steps"])
        row.note = f"stopped after {d['steps']}/{d['of_steps']} steps; full run ≈ {full:.0f} s"
    else:
        row.accs = [d["accuracy"]] * args.nodes
    append_jsonl(args.jsonl, {"bench": "scenarios", "scenario": sc.name, "system": "ddp", **d, "wire_sent": sent})
    return row


def run_p2p_row(sc: Scenario, variant: str, args: argparse.Namespace, place: Any, topo: Topology | None,
                workdir: Path, seed: int = 0) -> Row:
    extra = ["--set", f"training.partition={sc.partition}", "--set", f"training.partition_seed={args.partition_seed}",
             *(["--set", f"training.seed={seed}"] if seed else []), *VARIANTS[variant],
             *(arg for kv in args.settings for arg in ("--set", kv))]

    slowed = [args.nodes - 1]  # the node at half speed, once chosen

    def slow_last(cluster: Cluster) -> DutyCycle | None:
        if not sc.straggler:
            return None
        if sc.slow_reducer:
            ids = node_ids(cluster)
            slowed[0] = ids.index(min(ids))
        return DutyCycle([cluster.nodes[slowed[0]].pid], 0.5, args.slow_period)

    # --node-env KEY=VALUE; KEY= unsets it (benchlib.cluster sets OMP_NUM_THREADS=1, which a
    # systemd service does not)
    node_env: dict[str, str | None] = {k: v or None for k, _, v in (kv.partition("=") for kv in args.node_env)}
    before = topo.counters()[0] if topo else 0
    samples = args.p2p_samples or args.samples
    res: TrainResult = train(f"{sc.name}-{variant}" + (f"-seed{seed}" if args.repeat > 1 else ""), workdir, args.nodes, samples, extra, args.port,
                             args.timeout, place, kill_last_at=0.5 if sc.kill else 0.0,
                             restart_after=sc.restart_after if sc.kill else -1.0, on_start=slow_last, stagger=args.stagger,
                             kill_reducer=sc.kill_reducer,
                             ids=[f"{i:016x}" for i in range(args.nodes)] if sc.seed_reduces else (),
                             node_env=lambda i: node_env)
    sent = (topo.counters()[0] - before) if topo else float(res.bytes_received)
    fast = [r.train_seconds for r in res.rows if r.train_seconds is not None and not (sc.straggler and r.node == slowed[0])]
    row = Row(sc.name, f"p2pnode {variant}" + (f", seed {seed}" if args.repeat > 1 else ""), res.accuracies, sent,
              max(fast) if fast else res.max_train_s)
    if sc.straggler:
        slow = [r.train_seconds for r in res.rows if r.node == slowed[0] and r.train_seconds is not None]
        row.note = f"fast nodes' time; node {slowed[0]} took {slow[0]:.0f} s" if slow else ""
    if args.stagger:
        row.add_note(f"nodes started {args.stagger:.0f} s apart")
    if samples != args.samples:
        row.add_note(f"{samples} samples per node")
    missed = [r.sync_missed for r in res.rows]
    if any(missed):  # exchange.sync: a run with no missed round is deterministic; say where one was not
        replayed = [r.sync_replayed for r in res.rows]
        row.add_note(f"rounds missed {missed}, replayed {replayed}")
    far = [r.sync_largest_distance for r in res.rows if r.sync_largest_distance]
    if far:  # exchange.sync: how far from the others a contribution came, as the reducer saw them
        row.add_note(f"outliers {sum(r.sync_outliers for r in res.rows)}, largest distance {max(far):.2f}")
    if len(res.accuracies) < args.nodes:
        row.add_note(f"{len(res.accuracies)} of {args.nodes} checkpoints")
    append_jsonl(args.jsonl, {"bench": "scenarios", "scenario": sc.name, "system": "p2pnode", "variant": variant,
                              "settings": extra, "node_env": args.node_env, "stagger": args.stagger, **res.to_json(),
                              "wire_sent": sent})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--variants", nargs="+", default=["defaults"], choices=list(VARIANTS),
                    help="p2pnode settings to run in each scenario")
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="run each scenario this many times")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30000, help="training samples per node")
    ap.add_argument("--p2p-samples", type=int, default=0,
                    help="training samples per p2pnode node, if not --samples (said in the row's note)")
    ap.add_argument("--partition-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0,
                    help="DDP's initial model and batch orders, p2pnode's training.seed; repeat r uses seed + r")
    ap.add_argument("--slow-period", type=float, default=0.1,
                    help="the straggler's duty cycle: stopped for half of every this many seconds (DDP's rank too)")
    ap.add_argument("--stagger", type=float, default=0.0,
                    help="start p2pnode's node i this many seconds x i after node 0 (DDP cannot: its ranks wait)")
    ap.add_argument("--ddp-bucket-mb", type=float, default=DdpRun.bucket_cap_mb,
                    help="DDP's bucket size in MiB (0: DDP's default, 25 with a first bucket of 1): another sums "
                         "each element in another order (how far float32 rounding alone moves a seed's result)")
    ap.add_argument("--ddp-order", choices=["own", "p2pnode"], default=DdpRun.order,
                    help="DDP's batch orders: its own, or the ones p2pnode's nodes draw for the same seed (the "
                         "same batches in the same order: the two systems then differ only in how they average)")
    ap.add_argument("--ddp-only", action="store_true", help="run DDP alone, no p2pnode variant")
    ap.add_argument("--ddp-save", default="", metavar="DIR",
                    help="keep each DDP run's final model (and per-step records) in DIR/SCENARIO-seedS-pP-ORDER, "
                         "for a paired comparison with p2pnode's final models (scripts/archive/study_paired.py)")
    ap.add_argument("--ddp-max-seconds", type=float, default=240.0,
                    help="on thin links, stop DDP after this long and report its pace")
    ap.add_argument("--rate", default="", help="the thin scenarios' tc rate instead of their own (say 10mbit)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a node setting for every p2pnode variant, after the variant's own (repeatable; "
                         "printed with the table)")
    ap.add_argument("--node-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for every p2pnode node (repeatable; KEY= unsets it: "
                         "OMP_NUM_THREADS= runs the nodes as a service would, without the benchmark's 1)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--port", type=int, default=7571)
    ap.add_argument("--workdir", default=str(ROOT / "run" / "bench_scenarios"))
    add_output_args(ap, SECTION)
    args = ap.parse_args()
    if args.stagger and any(SCENARIOS[n].straggler for n in args.scenarios):
        ap.error("--stagger with the straggler scenario: its slow node would not be running yet")
    workdir = Path(args.workdir)
    rows: list[Row] = []
    for rep in range(args.repeat):
        seed = args.seed + rep  # each repeat a new draw for both systems: DDP is deterministic per seed
        for name in args.scenarios:
            sc = SCENARIOS[name]
            if sc.rate and (reason := unavailable()):
                print(f"== {name}: skipped ({reason})", flush=True)
                continue
            topo = Topology(args.nodes, tag="p2psc").up() if sc.rate else None
            try:
                if topo is not None:
                    topo.set_rate(args.rate or sc.rate, None if sc.thin_node is None else [sc.thin_node])
                place = topo.place if topo is not None else loopback
                if not args.skip_ddp:
                    print(f"== {name}: DDP", flush=True)
                    rows.append(run_ddp_row(sc, args, place, topo, seed))
                    print(json.dumps(rows[-1].__dict__), flush=True)
                for variant in [] if args.ddp_only else args.variants:
                    print(f"== {name}: p2pnode {variant}", flush=True)
                    rows.append(run_p2p_row(sc, variant, args, place, topo, workdir, seed))
                    print(json.dumps(rows[-1].__dict__), flush=True)
            finally:
                if topo is not None:
                    topo.down()
    header = ["scenario", "system", "accuracy % min / median / max", "spread (pt)", "bytes sent", "training time",
              "note"]
    text = table(header, [r.cells() for r in rows], "llrrrrl")
    also = "".join(f" --set {kv}" for kv in args.settings)
    settings = "\n".join(f"- p2pnode {v}: `{(' '.join(VARIANTS[v]) + also).strip() or '(conf/node.toml defaults)'}`"
                         for v in args.variants)
    if args.node_env:
        settings += "\n- every p2pnode node's environment: " + ", ".join(f"`{kv}`" for kv in args.node_env)
    print(text)
    print(settings)
    if args.write:
        write_section(f"{SECTION}\n\n{args.nodes} nodes, small CNN, Fashion-MNIST, {args.samples} samples per node, "
                      "cosine schedule; DDP (gloo, lr 0.2, momentum 0.9) on the same shards in the same run. "
                      "Accuracy: each node's final model on the 10 000 test images (DDP's ranks hold one model). "
                      "Bytes: DDP's all-reduce (all ranks), p2pnode's model payloads received (all nodes); on "
                      f"thin links the veth counters.\n\n```\n{command_line()}\n```\n\n- {machine()}\n{settings}\n\n"
                      f"{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
