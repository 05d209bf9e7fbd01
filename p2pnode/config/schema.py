"""The configuration's schema: one ``msgspec.Struct`` per TOML table, defaults documented in place.

Types carry what a single value must be, and msgspec checks it when a table is decoded
(p2pnode/config/load.py): choices are ``Literal``; numbers carry their bounds
(``msgspec.Meta``): counts are positive 64-bit integers, rates and factors non-negative,
timeouts and intervals at most a day (:data:`~p2pnode.config.grammar.MAX_SECONDS`). Every float
must be finite as well, which msgspec has no constraint for: the loader checks it. What depends
on several keys, or on a table of names kept elsewhere (models, compressors, tasks), is in
p2pnode/config/checks.py. conf/node.toml shows these defaults, and a test keeps them equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, get_args

import msgspec

from p2pnode.config.grammar import I64_MAX, MAX_SECONDS
from p2pnode.config.swim import SwimConfig

#: an integer > 0 (sizes, counts, periods in steps)
Positive = Annotated[int, msgspec.Meta(gt=0, le=I64_MAX)]
#: an integer >= 0 (0 usually means "off" or "never")
Count = Annotated[int, msgspec.Meta(ge=0, le=I64_MAX)]
#: a number > 0 (learning rates, factors)
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
#: a number >= 0
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
#: a momentum coefficient: 0 <= m < 1
Momentum = Annotated[float, msgspec.Meta(ge=0, lt=1)]
#: a timeout or interval in seconds, > 0 and at most a day
Seconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
#: as Seconds, 0 allowed (0: off)
SecondsOrOff = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]

#: node.role: a decentralised peer, or one side of the parameter-server mode (p2pnode/ps/)
Role = Literal["peer", "ps", "ps-worker"]
ROLES: tuple[str, ...] = get_args(Role)


class Table(msgspec.Struct, forbid_unknown_fields=True):
    """A TOML table: an unknown key is an error, not silently ignored."""


class NodeConfig(Table):
    #: HOST:PORT the HTTP server binds; port 0 picks a free one
    listen: str = "127.0.0.1:7070"
    #: HOST:PORT peers should use to reach us; empty means the bound listen address
    advertise: str = ""
    #: seeds to join through (any live member works); empty starts a new cluster. A string
    #: (``--set node.seeds=a:1,b:2``) is split at commas; each must be one HOST:PORT
    seeds: list[str] = msgspec.field(default_factory=list)
    #: where the node id, checkpoints and incarnation live
    state_dir: str = "./p2pnode-state"
    #: this node's id (1-128 printable characters, unique in the cluster); empty: 16 random hex
    #: digits drawn at the first start and kept in the state dir. Ids compare as strings, and
    #: the member with the lowest reduces in the synchronous mode (``exchange.sync``): "0-..."
    #: sorts before every random id, so it puts the reducer on the machine with the best link
    id: str = ""
    #: shared cluster secret; when set every request is HMAC-signed and checked
    secret: str = ""
    #: file holding the secret (preferred over ``secret`` in unit files)
    secret_file: str = ""
    #: TLS certificate and key for the HTTP server (both or neither)
    tls_cert: str = ""
    tls_key: str = ""
    #: CA bundle that peers' certificates must chain to; empty: tls_cert itself (one shared cert)
    tls_ca: str = ""
    #: with a secret set: a read-only token that opens the dashboard and status (GET only)
    #: to browsers, which cannot sign; the secret itself works as such a token too
    dashboard_token: str = ""
    #: file holding the dashboard token (preferred over ``dashboard_token``)
    dashboard_token_file: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: the event loop's CPU scheduling: "auto" runs its thread (that thread alone: the worker,
    #: the bulk threads and anything else it starts do not inherit it) in the kernel's round-robin
    #: real-time class at its lowest priority where the process may (root, CAP_SYS_NICE, or
    #: systemd's ``LimitRTPRIO=1``), so that a ping or a health check is answered at once on a
    #: machine whose cores the trainers and the disk's writeback keep busy; "normal" leaves it
    #: with the other threads. Why: p2pnode/priority.py
    loop_priority: Literal["auto", "normal"] = "auto"
    #: "peer" (decentralised training, the default), "ps" (a parameter server: holds the model,
    #: applies workers' pushed gradients as they come) or "ps-worker" (pushes gradients to the
    #: server, its first seed, and pulls its weights); p2pnode/ps/, docs/ARCHITECTURE.md
    role: Role = "peer"


class TrainingConfig(Table):
    #: "cnn" (Fashion-MNIST), "resnet18", "vgg11", "vgg19" (CIFAR-10)
    model: str = "cnn"
    #: "fashion-mnist", "cifar10" or "synthetic"
    data: Literal["fashion-mnist", "cifar10", "synthetic"] = "fashion-mnist"
    #: folder with the data set's files; empty: the Debian package for Fashion-MNIST
    data_dir: str = ""
    #: "i/n": train on the i-th of n disjoint shards of the training set
    shard: str = "0/1"
    #: how the n shards split the data: "iid" (interleaved, even), "dirichlet:alpha=A" (label
    #: skew, per-class proportions from Dir(A)) or "classes:k=K" (about K classes per node)
    partition: str = "iid"
    #: seed of the partition draw: every node must use the same one (shards stay disjoint)
    partition_seed: Count = 0
    batch_size: Positive = 64
    #: tuned for a cluster: averaging with peers acts like a larger batch (docs/BENCHMARKS.md)
    lr: PositiveFloat = 0.2
    momentum: Momentum = 0.9
    #: "sgd": momentum SGD, each node's buffer from its own gradients (the paper's);
    #: "qgm": quasi-global momentum (Lin et al. 2021), the buffer follows how the model moved,
    #: averaging included: less drift on skewed shards (docs/BENCHMARKS.md)
    optimizer: Literal["sgd", "qgm"] = "sgd"
    #: largest global gradient norm of a step (0: no clipping); guards skewed shards against a
    #: blow-up that averaging would spread: measured, Dirichlet 0.1 shards went from 10 % (all
    #: nodes diverged) to 85.6 %, IID 89.0 -> 89.2 % (docs/ALGORITHMS.md)
    grad_clip: NonNegative = 5.0
    #: "none", or "nesterov": DiLoCo's outer step over gossip (p2pnode/worker/outer.py): each
    #: exchange's average is taken as the round's pseudo-gradient from the round's start, and an
    #: outer Nesterov step applied; the round length is exchange.every (= publish_every), e.g. 50
    outer: Literal["none", "nesterov"] = "none"
    #: the outer step's learning rate and momentum (DiLoCo: 0.7 and 0.9)
    outer_lr: PositiveFloat = 0.7
    outer_momentum: Momentum = 0.9
    weight_decay: NonNegative = 0.0
    #: "constant" or "cosine" (cosine needs max_samples)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    #: samples over which the learning rate rises linearly from ~0 to lr
    warmup_samples: Count = 3200
    #: stop local training after this many samples (0: never); the node keeps serving
    max_samples: Count = 0
    #: a fresh node (no checkpoint) takes its first local step only once it sees this many
    #: alive peers, as DDP's ranks wait for each other (0: at once). Nodes that start minutes
    #: apart on skewed shards otherwise train apart and forget each other's classes
    #: (docs/ALGORITHMS.md, "A start together")
    min_peers: Count = 0
    #: ...or once this many seconds have passed without them (then it starts alone, logged);
    #: bounds start_settle's wait too
    min_peers_wait: Seconds = 600.0
    #: with min_peers = 0: a fresh node takes its first step once no new member has joined for
    #: this many seconds (each join starts the window again), or at once when a peer it sees is
    #: training already (0: no wait). Nodes started within the window of each other start
    #: together, as DDP's ranks do; a node alone pays it once. 45 s covers a 30 s stagger with
    #: a loaded machine's start-up spread (joins came 16-38 s apart): measured on 4 nodes,
    #: Dirichlet-0.1 shards, started 30 s apart, every node then ends where the same run started
    #: together does (docs/BENCHMARKS.md, "Nodes started 30 s apart"; docs/ALGORITHMS.md)
    start_settle: SecondsOrOff = 45.0
    #: evaluate on the test set every this many steps (0: never)
    eval_every: Count = 200
    #: test images per periodic evaluation (0: the whole test set)
    eval_samples: Count = 2000
    #: BatchNorm statistics are recomputed over this many training batches before each
    #: evaluation (0: never): averaging leaves them the statistics of no model anyone holds
    #: (p2pnode/worker/batchnorm.py); a model without BatchNorm is not touched
    bn_refresh: Count = 16
    #: torch threads in the worker; 1 keeps several nodes on one machine fair
    threads: Positive = 1
    seed: Count = 0
    #: size of the "synthetic" training set (its test set is a quarter of it)
    synthetic_samples: Positive = 4096
    #: "torch" (the trainer) or "stub" (numpy only, no learning: for tests of membership,
    #: auth, TLS and lifecycle that need real nodes but no training; p2pnode/worker/stub.py)
    worker: Literal["torch", "stub"] = "torch"
    #: the stub worker's model size in float32 parameters (0: its two small tensors); a big stub
    #: model costs next to no CPU a step (each step moves one window of it), so the exchange path
    #: of a big model is what a test or benchmark measures (p2pnode/worker/stub.py)
    stub_params: Count = 0
    #: what to train (docs/TASKS.md): empty for the built-in task of ``model`` and ``data``; an
    #: import string "my_pkg.tasks:photos"; or a short name: "imagefolder" (any torchvision
    #: model on folders of images) or one an installed package registers (entry point group
    #: "p2pnode.tasks"). Its settings are the [task] table
    task: str = ""
    #: "auto" (a CUDA GPU when torch sees one, else the CPU), "cpu" or "cuda[:i]"; what goes on
    #: the wire is always on the CPU
    device: str = "auto"
    #: DataLoader processes reading the training data (0: the worker reads it itself)
    loader_workers: Count = 0


class ExchangeConfig(Table):
    #: fetch a peer's model after every this many local steps (the paper: 1; see BENCHMARKS.md)
    every: Positive = 4
    #: peers fetched (at once) each round, averaged uniformly as they land (the n-th weighs
    #: 1/(n+1)): more mixing per round on links that have room for it
    peers_per_round: Positive = 1
    #: gossip for a task whose optimizer is adaptive (AdamW, Adam...: it moves every coordinate
    #: each step, so a top-10 % public copy lags far behind the model): "auto" publishes every
    #: entry (compression.publish = "topk:density=1.0") and fetches 2 peers a round, where those
    #: two keys are left at their defaults, for models under 16.7M parameters (64 MiB of float32:
    #: a bigger one's whole copies outgrew the machine's memory); "off" keeps them as they are. Over five seeds of two
    #: AdamW tasks it halved gossip's gap to all-reduce, at 7-9x the bytes (a byte LM's cluster
    #: had ended below a node alone on every seed; p2pnode/config/adaptive_gossip.py)
    adaptive_gossip: Literal["auto", "off"] = "auto"
    #: fetch the next round's peer while the last payload is still being applied (at most two
    #: rounds in flight, never two with the same peer): fresher models on slow links
    pipeline: bool = False
    #: steps this node may run ahead of its peers (the upper median of the steps its alive peers
    #: last reported): further ahead, its worker waits for them (0: no bound). A slow or dead
    #: peer holds nobody back while most peers keep up. 8 measured: the same median on
    #: Dirichlet-0.1 shards, without the low runs (docs/ALGORITHMS.md, "A bounded lead")
    max_lead: Count = 8
    #: seconds a fetch waits for the peer's answer to begin before the peer is skipped; the
    #: answer's body then has a deadline from its size and the throughput measured from that
    #: peer (4 x size / rate, at least this, at most max_transfer), and is cut off if it comes
    #: slower than min_rate (or 1/16 of the peer's measured rate) over any 2 s
    timeout: Seconds = 2.0
    #: the longest one model transfer may take, however large the model, seconds
    max_transfer: Seconds = 600.0
    #: bytes a second under which a model body is cut off (a peer trickling bytes)
    min_rate: NonNegative = 256 * 1024
    #: "mean" (x <- (x + x_peer)/2, the paper) or "contribution" (weighted by losses)
    averaging: Literal["mean", "contribution"] = "mean"
    #: "exponential" (one-peer exponential graph), "random" (the paper) or "ring"
    peer_selection: Literal["random", "ring", "exponential"] = "exponential"
    #: consecutive failed exchanges after which a peer is left out until it answers again
    fail_threshold: Positive = 3
    #: peers' public models kept as replicas for sparse deltas
    max_replicas: Positive = 16
    #: consensus finish: once local training ends, keep exchanging every ``finish_interval``
    #: seconds until ||x - x_peer|| / ||x|| is under this for every alive peer (0: no
    #: consensus phase, average once a second)
    consensus_tolerance: NonNegative = 0.01
    finish_interval: Seconds = 0.1
    #: a 304/503 answer slower than max(slow_answer x the peer's median answer time,
    #: slow_answer_floor seconds) counts as a failed exchange: a peer that holds us until just
    #: before the timeout with nothing to give is left out like one that does not answer
    slow_answer: PositiveFloat = 3.0
    slow_answer_floor: PositiveFloat = 1.0
    #: "clip" (self-centred clipping, He et al. 2022's ClippedGossip: a peer's model moves ours
    #: by at most a radius tau, so a poisoned peer cannot drag it away) or "none" (average as is).
    #: tau = clip_factor x the lower median over peers of their recent distances ||x_peer - x||
    #: / ||x||, at most clip_max (relative to ||x||; also the radius before any history).
    #: A model further than clip_refuse x tau is not averaged at all (an outlier: counted as a
    #: failed exchange, so a peer that keeps sending them is left out); clip_refuse >= 1, as a
    #: model within tau is always averaged.
    #: p2pnode/worker/robust.py, docs/ALGORITHMS.md
    robust: Literal["clip", "none"] = "clip"
    clip_factor: PositiveFloat = 3.0
    clip_max: PositiveFloat = 0.25
    clip_refuse: Annotated[float, msgspec.Meta(ge=1)] = 4.0
    #: who may push a model (POST /v1/model) or a gradient to a parameter server (POST
    #: /v1/ps/gradient): "members" (a running member, from its own host; p2pnode/daemon/push.py)
    #: or "any" (every sender: tests and closed networks only)
    accept_pushes: Literal["members", "any"] = "members"
    #: "powersgd": every step, average the nodes' gradients by a compressed all-reduce
    #: (synchronous PowerSGD through the member with the lowest id, p2pnode/sync/), so no node
    #: drifts towards its own data; no gossip runs beside it. Each step waits for the other
    #: nodes, up to sync_timeout (a dead or late node is left out of that step). "none": no
    #: all-reduce, gossip as configured. "auto" (the default): "powersgd" for peers with a
    #: cluster secret (node.secret or node.secret_file) and training.min_peers under 8, else
    #: "none" (p2pnode/config/mode_rule.py; docs/ALGORITHMS.md, "Gossip or the synchronous mode")
    sync: Literal["auto", "none", "powersgd"] = "auto"
    #: rank of PowerSGD's approximation of each weight matrix's mean gradient (24 with int4
    #: values: the bytes of rank 12 in int8 and of rank 6 in float16, and nearer DDP on skewed
    #: shards; docs/ALGORITHMS.md)
    sync_rank: Positive = 24
    #: the factors' values on the wire, both ways: "int4" (half a byte a value) or "int8" (one
    #: byte), in blocks of 64 with one float32 scale each (so twice, or four times, float16's
    #: values for the bytes: a higher rank for the same bytes; each node's error is then its
    #: own residual, its rounding owed, p2pnode/sync/worker_powersgd.py), or "float16". "auto" (the
    #: default): int8 when the task's optimizer is adaptive (AdamW, Adam...: a byte LM with AdamW
    #: ended 0.78 perplexity over its all-reduce reference in int4, 0.24 in int8 at the same rank,
    #: as near as every tensor whole in float16), else int4
    #: (p2pnode/sync/values.py resolve; docs/ALGORITHMS.md). Every node of a cluster must say
    #: the same (others' contributions are refused)
    sync_values: Literal["auto", "float16", "int8", "int4"] = "auto"
    #: seconds the reducer waits for the last contributions of a step after the first
    sync_timeout: Seconds = 2.0
    #: a node slower than the others' median step trains on a part of each batch (down to an
    #: eighth) so that its step keeps their pace and its data counts in every round. Off by
    #: default: with a node at half speed it gained 3.6 pt on Dirichlet 0.1 shards and lost
    #: 1.7 pt on even shards (docs/ALGORITHMS.md, "Synchronous PowerSGD"); off, a node much slower
    #: trains on whole batches and replays the rounds it missed instead
    sync_keep_pace: bool = False
    #: a node over 1.5 times the others' median step is slow: "never" waited for (the others
    #: finish sooner; its gradients are dropped, and where its classes are its own they are
    #: barely learned), "always" (as DDP: slower, and its data counts in every round at its
    #: whole weight; each phase still at most sync_timeout), or "auto": waited for when its
    #: label distribution is unlike the others' (total variation over 0.2: its classes are its
    #: own), not when it is like theirs (docs/ALGORITHMS.md, sync/lateness.py)
    sync_wait_for_slow: Literal["never", "auto", "always"] = "auto"
    #: a node's contribution to a step's mean further from the others' coordinate-wise median
    #: than this many times their median distance from it is an outlier, taken as the median
    #: (three nodes or more; p2pnode/sync/outliers.py). Against one node whose gradient is off
    #: by orders of magnitude (a bug, data of another scale, a hostile member), which otherwise
    #: steers every node's step. Honest nodes measured up to 7.2 (8 nodes, Dirichlet 0.1), a node
    #: scaled 100 times 330-400. 0: off
    sync_outlier: NonNegative = 20.0


class CompressionConfig(Table):
    #: gradient compressor before the local step ("mean-threshold" is the paper's mask; it
    #: costs accuracy for no traffic saved, as the gradient never leaves the node)
    gradient: str = "none"
    #: "none", "residual" (error feedback) or "dgc"
    gradient_memory: Literal["none", "residual", "dgc"] = "none"
    #: sparsifier for the published model difference q = C(x - x_hat)
    publish: str = "topk:density=0.1"
    #: publish after every this many local steps (best equal to exchange.every)
    publish_every: Positive = 4
    #: when the public copy moves: "fetch" (when a peer fetches, at most once a step, so the copy
    #: it averages in is at most a step old; and once nobody fetched for 4 x publish_every steps)
    #: or "steps" (every publish_every steps: what DiLoCo's rounds need). Fetch measured better on
    #: skewed and even shards (docs/BENCHMARKS.md, docs/ALGORITHMS.md)
    publish_on: Literal["steps", "fetch"] = "fetch"
    #: "float32", "float16" or "int8" values on the wire (int8: one power-of-two scale per tensor and
    #: delta, ~2 bytes an entry with its index; snapshots stay float32). int8 measured better on
    #: skewed shards at half the bytes of float32 (docs/BENCHMARKS.md)
    value_dtype: Literal["float32", "float16", "int8"] = "int8"
    #: published versions kept for sparse deltas; older requesters get a snapshot
    log_size: Positive = 64


class CheckpointConfig(Table):
    #: seconds between periodic checkpoints (0: only at shutdown)
    interval: SecondsOrOff = 30.0


class HttpConfig(Table):
    #: largest request body accepted, bytes (413 beyond); a pushed model's (POST /v1/model) follows
    #: the model instead, as max_payload_bytes says
    max_request_bytes: Positive = 64 * 1024 * 1024
    #: largest model payload accepted from a peer (fetched or pushed), bytes. 0 (the default): as large as a payload
    #: of this node's model can be (a delta naming every element, ~8 bytes a parameter;
    #: wire/codec.py max_encoded_bytes), so a model of any size can be exchanged; a value set
    #: here caps that further (an override, never a raise)
    max_payload_bytes: Count = 0
    #: seconds a "nothing new" (304) answer waits for the next publish before it is sent;
    #: bounds what a peer polling flat out costs; below exchange.timeout (checked)
    not_modified_hold: NonNegative = 0.25
    #: requests a second from one client IP (token bucket), bursts up to rate_burst; beyond
    #: it 429 (0: no limit). Peers behind one address (NAT, one host) share it
    rate_per_source: NonNegative = 100.0
    rate_burst: NonNegative = 200.0
    #: request bodies read at once, and bytes held for them; beyond either 503 (0: no limit)
    max_body_reads: Count = 8
    max_inflight_bytes: Count = 256 * 1024 * 1024
    #: full snapshots served a second to one client IP (bursts of snapshot_burst); beyond it
    #: 429. A peer needs one when it first meets this node or resynchronises, then deltas
    snapshot_rate_per_source: NonNegative = 2.0
    snapshot_burst: NonNegative = 16.0


#: [membership] keys that override a SWIM profile's value when non-zero
SWIM_TIMINGS = ("probe_interval", "probe_timeout", "suspicion_mult", "push_pull_interval")
#: [membership] keys that set SWIM's bounds (the same in every profile)
SWIM_BOUNDS = ("max_members", "max_new_per_message", "max_unverified", "max_unverified_per_source", "verify_rate",
               "verify_in_flight", "verify_retry_after", "max_incarnation_jump", "max_remembered")


class MembershipConfig(Table):
    #: "swim" (SWIM + Lifeguard, docs/MEMBERSHIP.md) or "simple" (member-list exchange)
    protocol: Literal["simple", "swim"] = "swim"
    #: seconds between member-list exchanges (simple protocol)
    gossip_interval: Seconds = 1.0
    #: seconds one membership request may take
    timeout: Seconds = 1.0
    #: "lan" or "wan" defaults for SWIM
    profile: Literal["lan", "wan"] = "lan"
    #: a node with no checkpoint starts from a live peer's full model
    bootstrap_from_peer: bool = True
    #: SWIM timings that override the profile's; 0 keeps the profile's value (lan / wan).
    #: Seconds between probes (1 / 5), that an ack may take before indirect probes (0.5 / 3),
    #: the suspicion timeout multiplier (4 / 6), seconds between full state exchanges
    #: (30 / 60; partitions heal at this pace). Tests shorten them to run in seconds.
    probe_interval: SecondsOrOff = 0.0
    probe_timeout: SecondsOrOff = 0.0
    suspicion_mult: Count = 0
    push_pull_interval: SecondsOrOff = 0.0
    #: SWIM's bounds against strangers (docs/MEMBERSHIP.md, "Hostile input"), the same in both
    #: profiles: members in the table at most; unknown members one received message may
    #: propose; proposed members waiting for their verification probe, in all and per source;
    #: verification probes started a second and outstanding at most; seconds an address whose
    #: probe failed rests; how far above the known incarnation a claim may be; live members'
    #: addresses saved in members.json (at most 1024: daemon/identity.py keeps no more)
    max_members: Positive = 16384
    max_new_per_message: Positive = 64
    max_unverified: Positive = 512
    max_unverified_per_source: Positive = 128
    verify_rate: PositiveFloat = 50.0
    verify_in_flight: Positive = 16
    verify_retry_after: SecondsOrOff = 10.0
    max_incarnation_jump: Positive = 1024
    max_remembered: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 64

    def swim_overrides(self) -> dict[str, Any]:
        """The SWIM timings set here (non-zero) and the bounds that differ from SWIM's own
        defaults, for ``SwimConfig.profile(profile, **...)``."""
        timings = {k: getattr(self, k) for k in SWIM_TIMINGS if getattr(self, k)}
        bounds = {k: getattr(self, k) for k in SWIM_BOUNDS if getattr(self, k) != getattr(SwimConfig, k)}
        return {**timings, **bounds}


class LoggingConfig(Table):
    #: "text" (one readable line per record) or "json" (one JSON object per line, the same
    #: schema from the daemon and the worker: p2pnode/logfmt.py)
    format: Literal["text", "json"] = "text"
    #: seconds between lines of the training journal STATE_DIR/history.jsonl (0: none)
    history_interval: SecondsOrOff = 10.0
    #: the journal's size bound: past it the file becomes history.jsonl.1 and a new one starts
    history_max_bytes: Annotated[int, msgspec.Meta(ge=4096, le=I64_MAX)] = 4 * 1024 * 1024


class Config(Table):
    node: NodeConfig = msgspec.field(default_factory=NodeConfig)
    training: TrainingConfig = msgspec.field(default_factory=TrainingConfig)
    exchange: ExchangeConfig = msgspec.field(default_factory=ExchangeConfig)
    compression: CompressionConfig = msgspec.field(default_factory=CompressionConfig)
    checkpoint: CheckpointConfig = msgspec.field(default_factory=CheckpointConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    membership: MembershipConfig = msgspec.field(default_factory=MembershipConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    #: settings of the task (training.task), given to it as they are: its own keys, checked by
    #: the task, not here (docs/TASKS.md); values are strings, numbers, booleans or lists
    task: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (what goes to the worker through the pipe, and back through
        :meth:`from_dict`)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    #: puts a dict on top of a config and checks the result (``load.merge``, then
    #: ``checks.validate``): set by the package (p2pnode/config/__init__.py), which imports both,
    #: so that the schema imports neither (they import the schema)
    fill: ClassVar[Callable[[Config, dict[str, Any]], None]]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """Defaults, then ``data`` on top, decoded and validated; :class:`ConfigError` if bad."""
        cfg = cls()
        cls.fill(cfg, data)
        return cfg
