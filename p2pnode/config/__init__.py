"""Node configuration: one ``msgspec.Struct`` per TOML table, defaults documented in place.

Sources, later ones win: built-in defaults, the TOML file (``--config``), then command-line
options. msgspec decodes and checks them against the schema (types, choices, bounds); explicit
checks follow for what depends on several keys. Validation is strict: an unknown key or a bad
value raises ``ConfigError`` with one line saying which key and why; the CLI prints it and exits
with code 2. None of it imports torch (the daemon process never loads it).

- ``grammar.py``: ``ConfigError``, and the grammars of string values (``parse_hostport``,
  ``parse_shard``, node ids, task names)
- ``swim.py``: ``SwimConfig``, the membership's SWIM profiles and bounds (the schema reads them)
- ``schema.py``: the tables, their types and defaults (conf/node.toml shows the same)
- ``load.py``: TOML, ``--set`` and merging, decoded by msgspec; its messages made one line
- ``checks.py``: ``validate``: names against their tables, grammars, rules between keys
- ``mode_rule.py``: ``exchange.sync = "auto"`` resolved to gossip or the synchronous mode, and why
- ``adaptive_gossip.py``: what gossip publishes and fetches for an adaptive optimizer
  (``exchange.adaptive_gossip``)
"""

from __future__ import annotations

from p2pnode.config.grammar import MAX_SECONDS, ConfigError, parse_hostport, parse_shard
from p2pnode.config.checks import fill, validate
from p2pnode.config.load import coerce, decode, load_file, merge, set_option
from p2pnode.config.schema import (
    ROLES,
    SWIM_BOUNDS,
    SWIM_TIMINGS,
    CheckpointConfig,
    CompressionConfig,
    Config,
    ExchangeConfig,
    HttpConfig,
    LoggingConfig,
    MembershipConfig,
    NodeConfig,
    TrainingConfig,
)

__all__ = [
    "MAX_SECONDS", "ROLES", "SWIM_BOUNDS", "SWIM_TIMINGS", "CheckpointConfig", "CompressionConfig", "Config",
    "ConfigError", "ExchangeConfig", "HttpConfig", "LoggingConfig", "MembershipConfig", "NodeConfig",
    "TrainingConfig", "coerce", "decode", "load_file", "merge", "parse_hostport", "parse_shard",
    "set_option", "validate",
]

Config.fill = fill  # what Config.from_dict does, given to the schema here (it imports neither load nor checks)
