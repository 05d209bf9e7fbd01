"""Config: TOML + CLI overrides, strict validation, one clear line and exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from p2pnode.cli import main
from p2pnode.config import Config, ConfigError, load_file, merge, validate

EXAMPLE = Path(__file__).resolve().parents[1] / "conf" / "node.toml"


def test_example_config_is_valid_and_matches_defaults() -> None:
    cfg = Config()
    merge(cfg, load_file(EXAMPLE))
    validate(cfg)
    assert cfg.to_dict() == Config().to_dict(), "conf/node.toml must document the defaults as they are"


@pytest.mark.parametrize("data, fragment", [
    ({"nodes": {}}, "unknown section [nodes]"),
    ({"node": {"listn": "x"}}, "unknown key node.listn"),
    ({"node": {"listen": "nowhere"}}, "node.listen"),
    ({"training": {"lr": "fast"}}, "training.lr: expected a number"),
    ({"training": {"lr": -1}}, "training.lr: must be > 0"),
    ({"training": {"batch_size": 1.5}}, "training.batch_size: expected an integer"),
    ({"training": {"shard": "3/3"}}, "training.shard"),
    ({"training": {"model": "gpt"}}, "training.model"),
    ({"exchange": {"averaging": "median"}}, "exchange.averaging"),
    ({"compression": {"publish": "mean-threshold:bogus=1"}}, "compression.publish"),
    ({"compression": {"gradient": "nosuch"}}, "compression.gradient"),
    ({"membership": {"protocol": "raft"}}, "membership.protocol"),
    ({"membership": {"suspicion_mult": -1}}, "membership.suspicion_mult: must be >= 0"),
    ({"membership": {"probe_timeout": 2.0}}, "probe_timeout must be shorter than probe_interval"),
    ({"training": {"outer": "adam"}}, "training.outer"),
    ({"training": {"outer_momentum": 1.0}}, "training.outer_momentum: must be < 1"),
    ({"training": {"outer": "nesterov"}}, 'needs exchange.robust = "none"'),
    ({"training": {"outer": "nesterov"}, "exchange": {"robust": "none"}}, 'needs compression.publish_on = "steps"'),
    ({"exchange": {"peers_per_round": 0}}, "exchange.peers_per_round: must be > 0"),
    ({"exchange": {"sync_outlier": 0.5}}, "exchange.sync_outlier: 0 (off) or at least 1"),
    ({"exchange": {"sync_outlier": -1}}, "exchange.sync_outlier: must be >= 0"),
])
def test_bad_values_are_named(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_dict(data)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_overrides_file(tmp_path: Path) -> None:
    from p2pnode.cli import build_config
    import argparse

    f = tmp_path / "n.toml"
    f.write_text('[training]\nlr = 0.1\nshard = "1/4"\n[node]\nseeds = ["127.0.0.1:1"]\n')
    ns = argparse.Namespace(config=str(f), seed=["127.0.0.1:2"], listen=None, advertise=None, state_dir=None,
                            data=None, data_dir=None, model=None, shard="2/4", set=["training.lr=0.2"])
    cfg = build_config(ns)
    assert cfg.training.lr == 0.2 and cfg.training.shard == "2/4" and cfg.node.seeds == ["127.0.0.1:2"]


@pytest.mark.parametrize("content, fragment", [
    ("[training]\nlr = \n", "config file"),
    ("[training]\nlearning_rate = 0.1\n", "unknown key training.learning_rate"),
])
def test_bad_config_file_exits_2_with_one_line(tmp_path: Path, content: str, fragment: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--config", str(f),
                           "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert not (tmp_path / "s").exists(), "a bad config must change nothing"


def test_missing_config_file_and_bad_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--config", str(tmp_path / "none.toml")]) == 2
    assert main(["start", "--set", "training.lr"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "SECTION.KEY=VALUE" in err


def test_swim_timings_override_the_profile_and_zero_keeps_it() -> None:
    from p2pnode.membership.swim import SwimConfig

    m = Config.from_dict({"membership": {"profile": "wan", "probe_interval": 0.4, "probe_timeout": 0.1,
                                         "push_pull_interval": 2}}).membership
    swim = SwimConfig.profile(m.profile, **m.swim_overrides())
    assert (swim.probe_interval, swim.probe_timeout, swim.push_pull_interval) == (0.4, 0.1, 2.0)
    assert swim.suspicion_mult == SwimConfig.wan().suspicion_mult  # 0: the profile's
    assert Config().membership.swim_overrides() == {}


def test_decoding_by_msgspec_keeps_one_line_per_key() -> None:
    """Choices are listed, --set strings take the key's type, a failed merge changes nothing,
    and validate() decodes again, so a value set by attribute is checked too."""
    from p2pnode.config import set_option

    with pytest.raises(ConfigError, match=r"^exchange\.averaging: 'median' is not one of mean, contribution$"):
        Config.from_dict({"exchange": {"averaging": "median"}})
    cfg = Config()
    set_option(cfg, "exchange.pipeline", "true")
    set_option(cfg, "node.seeds", "10.0.0.5:7070, 10.0.0.6:7070")
    set_option(cfg, "training.batch_size", "128")
    assert cfg.exchange.pipeline is True and cfg.training.batch_size == 128
    assert cfg.node.seeds == ["10.0.0.5:7070", "10.0.0.6:7070"]
    before = cfg.to_dict()
    with pytest.raises(ConfigError, match=r"^training\.momentum: must be < 1, got 1.5$"):
        merge(cfg, {"training": {"lr": 0.5, "momentum": 1.5}})
    assert cfg.to_dict() == before, "a refused merge must change nothing"
    cfg.exchange.timeout = float("inf")
    with pytest.raises(ConfigError, match=r"^exchange\.timeout: expected a finite number, got inf$"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"^\[training\] must be a table$"):
        merge(Config(), {"training": 3})
