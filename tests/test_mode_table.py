"""docs/ALGORITHMS.md's table of which mode a node runs ("Gossip or the synchronous mode")
against the code that picks it (p2pnode/config/mode_rule.py, p2pnode/modes.py): every row's
settings give the row's mode, every case of the rule ("auto" and the explicit settings) has a
row, and every mode of the registry has one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pnode.config import Config, ConfigError, set_option, validate
from p2pnode.config.mode_rule import AUTO_SYNC_MAX_NODES, RULES, choose, sync_of
from p2pnode.modes import MODES, mode_for

DOC = Path(__file__).resolve().parents[1] / "docs" / "ALGORITHMS.md"


def rows() -> list[tuple[dict[str, str], str]]:
    """(settings, mode class name) for each row of the table whose header is '| settings | mode |'."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| settings | mode |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        settings_cell, mode_cell = line.split("|")[1:3]
        settings = dict(re.findall(r'`([a-z_.]+) = "([^"]*)"`', settings_cell))
        out.append((settings, re.findall(r"\(`(\w+Mode)`\)", mode_cell)[0]))
    return out


def configured(settings: dict[str, str]) -> Config:
    cfg = Config()
    cfg.node.seeds = ["127.0.0.1:9"]  # a ps-worker's parameter server; anyone's first peer
    for key, value in settings.items():
        set_option(cfg, key, value)
    validate(cfg)  # a row the checks would refuse is no row
    return cfg


def test_every_row_of_the_docs_table_is_the_mode_the_code_picks() -> None:
    table = rows()
    assert len(table) >= 4
    rules = set()
    for settings, mode in table:
        cfg = configured(settings)
        assert mode_for(cfg).__name__ == mode, (settings, mode)
        rules.add(choose(cfg).rule)
    assert {m.__name__ for m in MODES} == {mode for _, mode in table}
    assert rules == set(RULES), f"cases of the rule with no row in the table: {set(RULES) - rules}"


def test_the_docs_state_the_rules_bound_on_the_cluster_size() -> None:
    text = DOC.read_text()
    assert f"more than {AUTO_SYNC_MAX_NODES} nodes" in text
    bounds = {(s.get("training.min_peers"), m) for s, m in rows() if "node.secret" in s}
    assert (str(AUTO_SYNC_MAX_NODES - 1), "SyncMode") in bounds and (str(AUTO_SYNC_MAX_NODES), "GossipMode") in bounds


def test_the_defaults_run_gossip_a_secret_the_synchronous_mode_and_an_explicit_setting_wins() -> None:
    assert Config().exchange.sync == "auto"
    assert mode_for(Config()).__name__ == "GossipMode" and choose(Config()).rule == "no-secret"
    for key, value in (("node.secret", "s"), ("node.secret_file", "/etc/p2pnode/secret")):
        cfg = Config()
        set_option(cfg, key, value)
        assert mode_for(cfg).__name__ == "SyncMode" and sync_of(cfg) == "powersgd", key
        set_option(cfg, "exchange.sync", "none")
        assert mode_for(cfg).__name__ == "GossipMode" and choose(cfg).rule == "set"
    cfg = Config()
    set_option(cfg, "exchange.sync", "powersgd")
    assert mode_for(cfg).__name__ == "SyncMode" and choose(cfg).why == 'exchange.sync = "powersgd" set'


def test_the_parameter_servers_roles_are_unchanged_and_the_checks_read_the_resolved_mode() -> None:
    for role, mode in (("ps", "PsServerMode"), ("ps-worker", "PsWorkerMode")):
        cfg = configured({"node.role": role, "node.secret": "s"})  # "auto": their own mode, no refusal
        assert mode_for(cfg).__name__ == mode and sync_of(cfg) == "none"
        set_option(cfg, "exchange.sync", "powersgd")
        with pytest.raises(ConfigError, match="exchange.sync"):
            validate(cfg)
    # DiLoCo's rounds with "auto" and a secret: gossip, accepted; by hand with the all-reduce: refused
    diloco = {"training.outer": "nesterov", "exchange.robust": "none", "compression.publish_on": "steps",
              "node.secret": "s"}
    assert mode_for(configured(diloco)).__name__ == "GossipMode"
    with pytest.raises(ConfigError, match="exchange.sync"):
        configured({**diloco, "exchange.sync": "powersgd"})
