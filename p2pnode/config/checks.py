"""What the schema's types cannot say: values checked against tables of names kept elsewhere
(models, compressors, partitions, tasks), strings with a grammar (addresses, shards, devices),
and rules between keys. Torch-free like the rest of the package: the daemon validates but never
builds a model or compressor, so these tables are read from torch-free modules.

What a configuration points at (files, the state directory, the port) is judged by
p2pnode/preflight.py, at ``p2pnode start``.
"""

from __future__ import annotations

import re
from typing import Any

from p2pnode.config.grammar import ConfigError, node_id_error, parse_hostport, parse_shard, task_name_error
from p2pnode.config.load import decode, merge
from p2pnode.config.mode_rule import sync_of
from p2pnode.config.schema import Config
from p2pnode.config.swim import SwimConfig


def validate(cfg: Config) -> None:
    """Check ``cfg`` whole: its values decoded again (so one set by attribute is checked too),
    then what depends on other keys or tables. Raises :class:`ConfigError`, one line."""
    decode(cfg.to_dict())
    _check_node(cfg)
    _check_training(cfg)
    _check_exchange(cfg)
    _check_membership(cfg)


def _check_node(cfg: Config) -> None:
    n = cfg.node
    if n.id and (why := node_id_error(n.id)) is not None:
        raise ConfigError(f"node.id: {why}")
    parse_hostport(n.listen, "node.listen")
    if n.advertise:
        parse_hostport(n.advertise, "node.advertise")
    for seed in n.seeds:
        parse_hostport(seed, "node.seeds")
    if bool(n.tls_cert) != bool(n.tls_key):
        raise ConfigError("node.tls_cert and node.tls_key go together")
    if n.role == "ps-worker" and not n.seeds:
        raise ConfigError("node.role: a ps-worker needs the parameter server's address as its first seed (--seed)")


def _check_training(cfg: Config) -> None:
    from p2pnode import partition
    from p2pnode.compression import specs
    from p2pnode.model_names import MODEL_INPUTS

    t, c = cfg.training, cfg.compression
    if t.model not in MODEL_INPUTS:
        raise ConfigError(f"training.model: {t.model!r} is not one of {', '.join(MODEL_INPUTS)}")
    if (why := task_name_error(t.task)) is not None:
        raise ConfigError(f"training.task: {why}")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device):
        raise ConfigError(f"training.device: {t.device!r} is not auto, cpu, cuda or cuda:I")
    if t.data == "cifar10" and not t.data_dir:
        raise ConfigError("training.data_dir: required for cifar10 (the folder holding cifar-10-batches-py)")
    if t.model != "cnn" and t.data == "fashion-mnist":
        raise ConfigError(f"training.model: {t.model!r} expects 32x32 colour images; use cnn with {t.data}")
    if t.model == "cnn" and t.data == "cifar10":
        raise ConfigError("training.model: cnn is for 28x28 grey images; use resnet18 or a vgg with cifar10")
    parse_shard(t.shard)
    try:
        partition.parse(t.partition)
    except partition.PartitionError as exc:
        raise ConfigError(f"training.partition: {exc}") from None
    if t.lr_schedule == "cosine" and not t.max_samples:
        raise ConfigError("training.lr_schedule: cosine needs training.max_samples")
    for key, sparse in (("gradient", False), ("publish", True)):
        try:
            specs.validate(getattr(c, key), require_sparse=sparse)
        except ValueError as exc:
            raise ConfigError(f"compression.{key}: {exc}") from None


def _check_exchange(cfg: Config) -> None:
    x = cfg.exchange
    # "auto" is gossip for the parameter server's roles and with training.outer (mode_rule.py):
    # only an explicit "powersgd" can ask for what cannot run
    if x.sync == "powersgd" and cfg.node.role != "peer":
        raise ConfigError(f"exchange.sync: {x.sync} is for peers, not node.role = {cfg.node.role!r}")
    if sync_of(cfg) != "none" and cfg.training.outer != "none":
        raise ConfigError("exchange.sync: an all-reduce every step leaves no rounds for training.outer")
    if cfg.training.outer == "nesterov" and x.robust == "clip":
        # measured: after a round of local steps honest models are far apart, and the clipper
        # refused 26-28 of 28 rounds per node as outliers: DiLoCo without the averaging
        raise ConfigError("training.outer: nesterov needs exchange.robust = \"none\" (robust clipping refuses "
                          "the far-apart models of DiLoCo rounds as outliers; docs/ALGORITHMS.md)")
    if cfg.training.outer == "nesterov" and cfg.compression.publish_on == "fetch":
        raise ConfigError("training.outer: nesterov needs compression.publish_on = \"steps\" (DiLoCo publishes "
                          "once a round, compression.publish_every = exchange.every; the default publishes "
                          "when fetched)")
    if 0 < x.sync_outlier < 1:
        # under the median distance about half the nodes would be replaced by the median every step
        raise ConfigError(f"exchange.sync_outlier: 0 (off) or at least 1 (median distances), got {x.sync_outlier:g}")
    if cfg.http.not_modified_hold >= x.timeout:
        raise ConfigError("http.not_modified_hold: must be below exchange.timeout, or peers time out on it")


def _check_membership(cfg: Config) -> None:
    m = cfg.membership
    try:
        SwimConfig.profile(m.profile, **m.swim_overrides())
    except ValueError as exc:  # e.g. a probe_timeout not below the probe_interval
        raise ConfigError(f"membership: {exc} (with the {m.profile} profile's other timings)") from None


def fill(cfg: Config, data: dict[str, Any]) -> None:
    """``data`` on top of ``cfg``, then the whole checked (``Config.from_dict``)."""
    merge(cfg, data)
    validate(cfg)
