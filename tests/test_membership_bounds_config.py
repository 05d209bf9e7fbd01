"""The [membership] keys of SWIM's bounds against strangers: their defaults are SwimConfig's
(conf/node.toml shows them), a value set there reaches the SWIM node's settings, and a bad one
stops the start with one line naming the key."""

from __future__ import annotations

import dataclasses

import pytest

from p2pnode.config import SWIM_BOUNDS, Config, ConfigError, MembershipConfig
from p2pnode.membership.swim import SwimConfig


def test_the_defaults_are_swims_own() -> None:
    for key in SWIM_BOUNDS:
        assert getattr(MembershipConfig(), key) == getattr(SwimConfig(), key), key
    assert {f.name for f in dataclasses.fields(SwimConfig)} >= set(SWIM_BOUNDS)


def test_a_bound_set_in_the_config_reaches_swim() -> None:
    m = Config.from_dict({"membership": {"max_members": 100, "max_new_per_message": 8, "verify_rate": 5.5,
                                         "max_remembered": 0, "profile": "wan"}}).membership
    swim = SwimConfig.profile(m.profile, **m.swim_overrides())
    assert (swim.max_members, swim.max_new_per_message, swim.verify_rate, swim.max_remembered) == (100, 8, 5.5, 0)
    assert swim.probe_interval == SwimConfig.wan().probe_interval  # the profile's timings stay


@pytest.mark.parametrize("key, value", [("max_members", 1), ("max_new_per_message", 0), ("max_unverified", -3),
                                        ("verify_rate", 0), ("verify_in_flight", 0), ("max_incarnation_jump", 0),
                                        ("max_remembered", 5000), ("verify_retry_after", -1)])
def test_a_bad_bound_is_refused_naming_its_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"membership.*{key}"):
        Config.from_dict({"membership": {key: value}})
