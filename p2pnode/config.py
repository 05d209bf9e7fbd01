"""Node configuration: one dataclass per TOML table, defaults documented in place.

Sources, later ones win: built-in defaults, the TOML file (``--config``), then command-line
options. Validation is strict: an unknown key or a bad value raises ``ConfigError`` with one
line saying which key and why; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints


class ConfigError(ValueError):
    """A configuration problem, worded for the person who wrote the file."""


#: a host name or IPv4 address, or an IPv6 address in brackets (with an optional zone)
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?\]")


def parse_hostport(value: str, key: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` only: no scheme, no path, one address (a mistaken ``http://h:p`` or
    ``a:1,b:2`` is refused here, not 18 s later when the join fails)."""
    host, sep, port = value.rpartition(":")
    if not sep or not _HOST.fullmatch(host) or not port.isdigit() or not 0 <= int(port) <= 65535:
        hint = ""
        if "://" in value:
            hint = " (no scheme: write HOST:PORT; TLS is node.tls_cert)"
        elif "," in value or " " in value.strip():
            hint = " (one address each: repeat --seed, or a TOML list)"
        elif ":" in host and not host.startswith("["):
            hint = " (an IPv6 address goes in brackets: [::1]:7070)"
        raise ConfigError(f"{key}: {value!r} is not HOST:PORT{hint}")
    return host.strip("[]"), int(port)


@dataclass
class NodeConfig:
    #: HOST:PORT the HTTP server binds; port 0 picks a free one
    listen: str = "127.0.0.1:7070"
    #: HOST:PORT peers should use to reach us; empty means the bound listen address
    advertise: str = ""
    #: seeds to join through (any live member works); empty starts a new cluster
    seeds: list[str] = field(default_factory=list)
    #: where the node id, checkpoints and incarnation live
    state_dir: str = "./p2pnode-state"
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
    log_level: str = "info"
    #: "peer" (decentralised training, the default), "ps" (a parameter server: holds the model,
    #: applies workers' pushed gradients as they come) or "ps-worker" (pushes gradients to the
    #: server, its first seed, and pulls its weights); p2pnode/ps/, docs/ARCHITECTURE.md
    role: str = "peer"


@dataclass
class TrainingConfig:
    #: "cnn" (Fashion-MNIST), "resnet18", "vgg11", "vgg19" (CIFAR-10)
    model: str = "cnn"
    #: "fashion-mnist", "cifar10" or "synthetic"
    data: str = "fashion-mnist"
    #: folder with the data set's files; empty: the Debian package for Fashion-MNIST
    data_dir: str = ""
    #: "i/n": train on the i-th of n disjoint shards of the training set
    shard: str = "0/1"
    #: how the n shards split the data: "iid" (interleaved, even), "dirichlet:alpha=A" (label
    #: skew, per-class proportions from Dir(A)) or "classes:k=K" (about K classes per node)
    partition: str = "iid"
    #: seed of the partition draw: every node must use the same one (shards stay disjoint)
    partition_seed: int = 0
    batch_size: int = 64
    #: tuned for a cluster: averaging with peers acts like a larger batch (docs/BENCHMARKS.md)
    lr: float = 0.2
    momentum: float = 0.9
    #: "sgd": momentum SGD, each node's buffer from its own gradients (the paper's);
    #: "qgm": quasi-global momentum (Lin et al. 2021), the buffer follows how the model moved,
    #: averaging included: less drift on skewed shards (docs/BENCHMARKS.md)
    optimizer: str = "sgd"
    #: largest global gradient norm of a step (0: no clipping); guards skewed shards against a
    #: blow-up that averaging would spread: measured, Dirichlet 0.1 shards went from 10 % (all
    #: nodes diverged) to 85.6 %, IID 89.0 -> 89.2 % (docs/ALGORITHMS.md)
    grad_clip: float = 5.0
    #: "none", or "nesterov": DiLoCo's outer step over gossip (p2pnode/worker/outer.py): each
    #: exchange's average is taken as the round's pseudo-gradient from the round's start, and an
    #: outer Nesterov step applied; the round length is exchange.every (= publish_every), e.g. 50
    outer: str = "none"
    #: the outer step's learning rate and momentum (DiLoCo: 0.7 and 0.9)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    weight_decay: float = 0.0
    #: "constant" or "cosine" (cosine needs max_samples)
    lr_schedule: str = "constant"
    #: samples over which the learning rate rises linearly from ~0 to lr
    warmup_samples: int = 3200
    #: stop local training after this many samples (0: never); the node keeps serving
    max_samples: int = 0
    #: evaluate on the test set every this many steps (0: never)
    eval_every: int = 200
    #: test images per periodic evaluation (0: the whole test set)
    eval_samples: int = 2000
    #: torch threads in the worker; 1 keeps several nodes on one machine fair
    threads: int = 1
    seed: int = 0
    #: size of the "synthetic" training set (its test set is a quarter of it)
    synthetic_samples: int = 4096
    #: "torch" (the trainer) or "stub" (numpy only, no learning: for tests of membership,
    #: auth, TLS and lifecycle that need real nodes but no training; p2pnode/worker/stub.py)
    worker: str = "torch"
    #: what to train (docs/TASKS.md): empty for the built-in task of ``model`` and ``data``; an
    #: import string "my_pkg.tasks:photos"; or a short name: "imagefolder" (any torchvision
    #: model on folders of images) or one an installed package registers (entry point group
    #: "p2pnode.tasks"). Its settings are the [task] table
    task: str = ""
    #: "auto" (a CUDA GPU when torch sees one, else the CPU), "cpu" or "cuda[:i]"; what goes on
    #: the wire is always on the CPU
    device: str = "auto"
    #: DataLoader processes reading the training data (0: the worker reads it itself)
    loader_workers: int = 0


@dataclass
class ExchangeConfig:
    #: fetch a peer's model after every this many local steps (the paper: 1; see BENCHMARKS.md)
    every: int = 4
    #: peers fetched (at once) each round, each averaged in as it arrives: more mixing per
    #: round on links that have room for it
    peers_per_round: int = 1
    #: fetch the next round's peer while the last payload is still being applied (at most two
    #: rounds in flight, never two with the same peer): fresher models on slow links
    pipeline: bool = False
    #: seconds one fetch may take before the peer is skipped
    timeout: float = 2.0
    #: "mean" (x <- (x + x_peer)/2, the paper) or "contribution" (weighted by losses)
    averaging: str = "mean"
    #: "exponential" (one-peer exponential graph), "random" (the paper) or "ring"
    peer_selection: str = "exponential"
    #: consecutive failed exchanges after which a peer is left out until it answers again
    fail_threshold: int = 3
    #: peers' public models kept as replicas for sparse deltas
    max_replicas: int = 16
    #: consensus finish: once local training ends, keep exchanging every ``finish_interval``
    #: seconds until ||x - x_peer|| / ||x|| is under this for every alive peer (0: no
    #: consensus phase, average once a second)
    consensus_tolerance: float = 0.01
    finish_interval: float = 0.1
    #: a 304/503 answer slower than max(slow_answer x the peer's median answer time,
    #: slow_answer_floor seconds) counts as a failed exchange: a peer that holds us until just
    #: before the timeout with nothing to give is left out like one that does not answer
    slow_answer: float = 3.0
    slow_answer_floor: float = 1.0
    #: "clip" (self-centred clipping, He et al. 2022's ClippedGossip: a peer's model moves ours
    #: by at most a radius tau, so a poisoned peer cannot drag it away) or "none" (average as is).
    #: tau = clip_factor x the lower median over peers of their recent distances ||x_peer - x||
    #: / ||x||, at most clip_max (relative to ||x||; also the radius before any history).
    #: A model further than clip_refuse x tau is not averaged at all (an outlier: counted as a
    #: failed exchange, so a peer that keeps sending them is left out).
    #: p2pnode/worker/robust.py, docs/ALGORITHMS.md
    robust: str = "clip"
    clip_factor: float = 3.0
    clip_max: float = 0.25
    clip_refuse: float = 4.0
    #: who may push a model (POST /v1/model): "members" (a running member, from its own host;
    #: p2pnode/daemon/push.py) or "any" (every sender: tests and closed networks only)
    accept_pushes: str = "members"


@dataclass
class CompressionConfig:
    #: gradient compressor before the local step ("mean-threshold" is the paper's mask; it
    #: costs accuracy for no traffic saved, as the gradient never leaves the node)
    gradient: str = "none"
    #: "none", "residual" (error feedback) or "dgc"
    gradient_memory: str = "none"
    #: sparsifier for the published model difference q = C(x - x_hat)
    publish: str = "topk:density=0.1"
    #: publish after every this many local steps (best equal to exchange.every)
    publish_every: int = 4
    #: "float32" or "float16" values on the wire
    value_dtype: str = "float32"
    #: published versions kept for sparse deltas; older requesters get a snapshot
    log_size: int = 64


@dataclass
class CheckpointConfig:
    #: seconds between periodic checkpoints (0: only at shutdown)
    interval: float = 30.0


@dataclass
class HttpConfig:
    #: largest request body accepted, bytes (413 beyond)
    max_request_bytes: int = 64 * 1024 * 1024
    #: largest model payload accepted from a peer, bytes
    max_payload_bytes: int = 512 * 1024 * 1024
    #: seconds a "nothing new" (304) answer waits for the next publish before it is sent;
    #: bounds what a peer polling flat out costs; keep it well under exchange.timeout
    not_modified_hold: float = 0.25
    #: requests a second from one client IP (token bucket), bursts up to rate_burst; beyond
    #: it 429 (0: no limit). Peers behind one address (NAT, one host) share it
    rate_per_source: float = 100.0
    rate_burst: float = 200.0
    #: request bodies read at once, and bytes held for them; beyond either 503 (0: no limit)
    max_body_reads: int = 8
    max_inflight_bytes: int = 256 * 1024 * 1024
    #: full snapshots served a second to one client IP (bursts of snapshot_burst); beyond it
    #: 429. A peer needs one when it first meets this node or resynchronises, then deltas
    snapshot_rate_per_source: float = 2.0
    snapshot_burst: float = 16.0


@dataclass
class MembershipConfig:
    #: "swim" (SWIM + Lifeguard, docs/MEMBERSHIP.md) or "simple" (member-list exchange)
    protocol: str = "swim"
    #: seconds between member-list exchanges (simple protocol)
    gossip_interval: float = 1.0
    #: seconds one membership request may take
    timeout: float = 1.0
    #: "lan" or "wan" defaults for SWIM
    profile: str = "lan"
    #: a node with no checkpoint starts from a live peer's full model
    bootstrap_from_peer: bool = True
    #: SWIM timings that override the profile's; 0 keeps the profile's value (lan / wan).
    #: Seconds between probes (1 / 5), that an ack may take before indirect probes (0.5 / 3),
    #: the suspicion timeout multiplier (4 / 6), seconds between full state exchanges
    #: (30 / 60; partitions heal at this pace). Tests shorten them to run in seconds.
    probe_interval: float = 0.0
    probe_timeout: float = 0.0
    suspicion_mult: int = 0
    push_pull_interval: float = 0.0
    #: SWIM's bounds against strangers (docs/MEMBERSHIP.md, "Hostile input"), the same in both
    #: profiles: members in the table at most; unknown members one received message may
    #: propose; proposed members waiting for their verification probe, in all and per source;
    #: verification probes started a second and outstanding at most; seconds an address whose
    #: probe failed rests; how far above the known incarnation a claim may be; live members'
    #: addresses saved in members.json (at most 1024)
    max_members: int = 16384
    max_new_per_message: int = 64
    max_unverified: int = 512
    max_unverified_per_source: int = 128
    verify_rate: float = 50.0
    verify_in_flight: int = 16
    verify_retry_after: float = 10.0
    max_incarnation_jump: int = 1024
    max_remembered: int = 64

    def swim_overrides(self) -> dict[str, Any]:
        """The SWIM timings set here (non-zero) and the bounds that differ from SWIM's own
        defaults, for ``SwimConfig.profile(profile, **...)``."""
        from p2pnode.membership.swim.config import SwimConfig

        timings = {k: getattr(self, k) for k in SWIM_TIMINGS if getattr(self, k)}
        bounds = {k: getattr(self, k) for k in SWIM_BOUNDS if getattr(self, k) != getattr(SwimConfig, k)}
        return {**timings, **bounds}


@dataclass
class LoggingConfig:
    #: "text" (one readable line per record) or "json" (one JSON object per line, the same
    #: schema from the daemon and the worker: p2pnode/logfmt.py)
    format: str = "text"
    #: seconds between lines of the training journal STATE_DIR/history.jsonl (0: none)
    history_interval: float = 10.0
    #: the journal's size bound: past it the file becomes history.jsonl.1 and a new one starts
    history_max_bytes: int = 4 * 1024 * 1024


#: node.role: a decentralised peer, or one side of the parameter-server mode (p2pnode/ps/)
ROLES = ("peer", "ps", "ps-worker")

#: [membership] keys that override a SWIM profile's value when non-zero
SWIM_TIMINGS = ("probe_interval", "probe_timeout", "suspicion_mult", "push_pull_interval")
#: [membership] keys that set SWIM's bounds (the same in every profile)
SWIM_BOUNDS = ("max_members", "max_new_per_message", "max_unverified", "max_unverified_per_source", "verify_rate",
               "verify_in_flight", "verify_retry_after", "max_incarnation_jump", "max_remembered")


@dataclass
class Config:
    node: NodeConfig = field(default_factory=NodeConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: settings of the task (training.task), given to it as they are: its own keys, checked by
    #: the task, not here (docs/TASKS.md)
    task: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        cfg = cls()
        merge(cfg, data)
        validate(cfg)
        return cfg


def _coerce(section: str, key: str, value: Any, typ: Any) -> Any:
    where = f"{section}.{key}"
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int):
            if not -(2**63) <= value < 2**63:  # travels to the worker as a 64-bit integer
                raise ConfigError(f"{where}: {value} is out of range (64-bit integer)")
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if typ is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(number):  # inf or nan: never a meaningful step size, timeout or interval
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if typ == list[str]:
        if isinstance(value, str):
            return [v for v in (s.strip() for s in value.split(",")) if v]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
    raise ConfigError(f"{where}: unsupported type")  # pragma: no cover - a bug in this file


def merge(cfg: Config, data: dict[str, Any]) -> None:
    """Apply a nested mapping (as from TOML) onto ``cfg``; unknown keys are errors."""
    if not isinstance(data, dict):
        raise ConfigError("configuration must be a table")
    sections = {f.name for f in dataclasses.fields(cfg)}
    for section, values in data.items():
        if section not in sections:
            raise ConfigError(f"unknown section [{section}]; known: {', '.join(sorted(sections))}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table")
        target = getattr(cfg, section)
        if isinstance(target, dict):  # [task]: the task's own keys, read and checked by the task
            for key, value in values.items():
                if not isinstance(value, (str, int, float, bool, list)):
                    raise ConfigError(f"{section}.{key}: expected a string, number, boolean or list, got {value!r}")
                target[key] = value
            continue
        hints = get_type_hints(type(target))
        for key, value in values.items():
            if key not in hints:
                known = ", ".join(sorted(hints))
                raise ConfigError(f"unknown key {section}.{key}; known keys of [{section}]: {known}")
            setattr(target, key, _coerce(section, key, value, hints[key]))


def set_option(cfg: Config, dotted: str, value: str) -> None:
    """``--set training.lr=0.1`` style override."""
    section, sep, key = dotted.partition(".")
    if not sep:
        raise ConfigError(f"--set {dotted}: expected SECTION.KEY=VALUE")
    merge(cfg, {section: {key: value}})


def load_file(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def _choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def _positive(where: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ConfigError(f"{where}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


#: the longest timeout or interval accepted, seconds: anything longer is a typo, not a plan
MAX_SECONDS = 86400


def parse_shard(value: str) -> tuple[int, int]:
    i, sep, n = value.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 0 <= int(i) < int(n):
        raise ConfigError(f"training.shard: {value!r} is not I/N with 0 <= I < N")
    return int(i), int(n)


def validate(cfg: Config) -> None:
    """Check values whose type is right but whose meaning is wrong."""
    # Both tables are torch-free: the daemon validates but never builds a model or compressor.
    from p2pnode import partition
    from p2pnode.compression import specs
    from p2pnode.model_names import MODEL_INPUTS

    n, t, x, c = cfg.node, cfg.training, cfg.exchange, cfg.compression
    parse_hostport(n.listen, "node.listen")
    if n.advertise:
        parse_hostport(n.advertise, "node.advertise")
    for seed in n.seeds:
        parse_hostport(seed, "node.seeds")
    if bool(n.tls_cert) != bool(n.tls_key):
        raise ConfigError("node.tls_cert and node.tls_key go together")
    _choice("node.log_level", n.log_level, ("debug", "info", "warning", "error"))
    _choice("node.role", n.role, ROLES)
    if n.role == "ps-worker" and not n.seeds:
        raise ConfigError("node.role: a ps-worker needs the parameter server's address as its first seed (--seed)")
    _choice("logging.format", cfg.logging.format, ("text", "json"))
    _positive("logging.history_interval", cfg.logging.history_interval, allow_zero=True)
    if cfg.logging.history_max_bytes < 4096:
        raise ConfigError(f"logging.history_max_bytes: must be >= 4096, got {cfg.logging.history_max_bytes}")
    _choice("training.model", t.model, tuple(MODEL_INPUTS))
    _choice("training.data", t.data, ("fashion-mnist", "cifar10", "synthetic"))
    _choice("training.worker", t.worker, ("torch", "stub"))
    from p2pnode.tasks.registry import check_syntax

    if (why := check_syntax(t.task)) is not None:
        raise ConfigError(f"training.task: {why}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
        raise ConfigError(f"training.device: {t.device!r} is not auto, cpu, cuda or cuda:I")
    _positive("training.loader_workers", t.loader_workers, allow_zero=True)
    if t.data == "cifar10" and not t.data_dir:
        raise ConfigError("training.data_dir: required for cifar10 (the folder holding cifar-10-batches-py)")
    want_channels = 1 if t.data in ("fashion-mnist", "synthetic") else 3
    if t.model != "cnn" and want_channels == 1 and t.data == "fashion-mnist":
        raise ConfigError(f"training.model: {t.model!r} expects 32x32 colour images; use cnn with {t.data}")
    if t.model == "cnn" and t.data == "cifar10":
        raise ConfigError("training.model: cnn is for 28x28 grey images; use resnet18 or a vgg with cifar10")
    parse_shard(t.shard)
    try:
        partition.parse(t.partition)
    except partition.PartitionError as exc:
        raise ConfigError(f"training.partition: {exc}") from None
    for key in ("batch_size", "threads", "synthetic_samples"):
        _positive(f"training.{key}", getattr(t, key))
    _positive("training.lr", t.lr)
    for key in ("momentum", "weight_decay"):
        _positive(f"training.{key}", getattr(t, key), allow_zero=True)
    if t.momentum >= 1:
        raise ConfigError("training.momentum: must be < 1")
    for key in ("max_samples", "warmup_samples", "eval_every", "eval_samples", "seed", "partition_seed"):
        _positive(f"training.{key}", getattr(t, key), allow_zero=True)
    _choice("training.lr_schedule", t.lr_schedule, ("constant", "cosine"))
    _choice("training.optimizer", t.optimizer, ("sgd", "qgm"))
    _positive("training.grad_clip", t.grad_clip, allow_zero=True)
    _choice("training.outer", t.outer, ("none", "nesterov"))
    _positive("training.outer_lr", t.outer_lr)
    _positive("training.outer_momentum", t.outer_momentum, allow_zero=True)
    if t.outer_momentum >= 1:
        raise ConfigError("training.outer_momentum: must be < 1")
    if t.lr_schedule == "cosine" and not t.max_samples:
        raise ConfigError("training.lr_schedule: cosine needs training.max_samples")
    _positive("exchange.every", x.every)
    _positive("exchange.peers_per_round", x.peers_per_round)
    _positive("exchange.timeout", x.timeout)
    _positive("exchange.fail_threshold", x.fail_threshold)
    _positive("exchange.max_replicas", x.max_replicas)
    _positive("exchange.consensus_tolerance", x.consensus_tolerance, allow_zero=True)
    _positive("exchange.finish_interval", x.finish_interval)
    _choice("exchange.averaging", x.averaging, ("mean", "contribution"))
    _choice("exchange.peer_selection", x.peer_selection, ("random", "ring", "exponential"))
    for key, sparse in (("gradient", False), ("publish", True)):
        try:
            specs.validate(getattr(c, key), require_sparse=sparse)
        except ValueError as exc:
            raise ConfigError(f"compression.{key}: {exc}") from None
    _choice("compression.gradient_memory", c.gradient_memory, ("none", "residual", "dgc"))
    _choice("compression.value_dtype", c.value_dtype, ("float32", "float16"))
    _positive("compression.publish_every", c.publish_every)
    _positive("compression.log_size", c.log_size)
    _positive("checkpoint.interval", cfg.checkpoint.interval, allow_zero=True)
    _positive("http.max_request_bytes", cfg.http.max_request_bytes)
    _positive("http.max_payload_bytes", cfg.http.max_payload_bytes)
    _positive("http.not_modified_hold", cfg.http.not_modified_hold, allow_zero=True)
    for key in ("rate_per_source", "rate_burst", "max_body_reads", "max_inflight_bytes", "snapshot_rate_per_source",
                "snapshot_burst"):
        _positive(f"http.{key}", getattr(cfg.http, key), allow_zero=True)
    _positive("exchange.slow_answer", x.slow_answer)
    _positive("exchange.slow_answer_floor", x.slow_answer_floor)
    _choice("exchange.robust", x.robust, ("clip", "none"))
    _choice("exchange.accept_pushes", x.accept_pushes, ("members", "any"))
    if t.outer == "nesterov" and x.robust == "clip":
        # measured: after a round of local steps honest models are far apart, and the clipper
        # refused 26-28 of 28 rounds per node as outliers: DiLoCo without the averaging
        raise ConfigError("training.outer: nesterov needs exchange.robust = \"none\" (robust clipping refuses "
                          "the far-apart models of DiLoCo rounds as outliers; docs/ALGORITHMS.md)")
    _positive("exchange.clip_factor", x.clip_factor)
    _positive("exchange.clip_max", x.clip_max)
    _positive("exchange.clip_refuse", x.clip_refuse)
    if x.clip_refuse < 1:
        raise ConfigError(f"exchange.clip_refuse: must be >= 1 (a model within tau is always averaged), got {x.clip_refuse}")
    if cfg.http.not_modified_hold >= x.timeout:
        raise ConfigError("http.not_modified_hold: must be below exchange.timeout, or peers time out on it")
    for where, seconds in (("exchange.timeout", x.timeout), ("exchange.finish_interval", x.finish_interval),
                           ("checkpoint.interval", cfg.checkpoint.interval),
                           ("logging.history_interval", cfg.logging.history_interval),
                           ("membership.gossip_interval", cfg.membership.gossip_interval),
                           ("membership.timeout", cfg.membership.timeout)):
        if seconds > MAX_SECONDS:
            raise ConfigError(f"{where}: {seconds:g} s is more than a day ({MAX_SECONDS} s)")
    m = cfg.membership
    _choice("membership.protocol", m.protocol, ("simple", "swim"))
    _choice("membership.profile", m.profile, ("lan", "wan"))
    _positive("membership.gossip_interval", m.gossip_interval)
    _positive("membership.timeout", m.timeout)
    for key in SWIM_TIMINGS:
        _positive(f"membership.{key}", getattr(m, key), allow_zero=True)
    for key in SWIM_BOUNDS:  # SwimConfig checks each too; this names the key
        _positive(f"membership.{key}", getattr(m, key), allow_zero=key in ("verify_retry_after", "max_remembered"))
    if m.max_remembered > 1024:  # members.json keeps at most 1024 (daemon/identity.py)
        raise ConfigError(f"membership.max_remembered: at most 1024, got {m.max_remembered}")
    if m.verify_retry_after > MAX_SECONDS:
        raise ConfigError(f"membership.verify_retry_after: {m.verify_retry_after:g} s is more than a day")
    from p2pnode.membership.swim.config import SwimConfig

    try:
        SwimConfig.profile(m.profile, **m.swim_overrides())
    except ValueError as exc:  # e.g. a probe_timeout not below the probe_interval
        raise ConfigError(f"membership: {exc} (with the {m.profile} profile's other timings)") from None
