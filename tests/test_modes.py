"""The registry of modes (p2pnode/modes.py): every configuration the checks accept runs exactly
one mode, and the worker module each names is there to import in the spawned process."""

from __future__ import annotations

import importlib.util

from p2pnode.config import ROLES, Config, ConfigError
from p2pnode.daemon.mode import Mode
from p2pnode.modes import MODES, mode_for



def configs() -> list[tuple[str, str, Config | None]]:
    """(role, sync, the config, or None where the checks refuse it) for every pair."""
    out = []
    for role in ROLES:
        for sync in ("none", "powersgd"):
            data = {"node": {"role": role, "seeds": ["127.0.0.1:9"]}, "exchange": {"sync": sync}}
            try:
                out.append((role, sync, Config.from_dict(data)))
            except ConfigError:
                out.append((role, sync, None))
    return out


def test_every_accepted_configuration_runs_exactly_one_mode() -> None:
    accepted = 0
    for role, sync, cfg in configs():
        if cfg is None:
            continue
        accepted += 1
        chosen = [m.__name__ for m in MODES if m.chosen(cfg)]
        assert len(chosen) == 1, (role, sync, chosen)
        assert mode_for(cfg).__name__ == chosen[0]
    assert accepted == len(MODES)  # gossip, sync, ps, ps-worker: each reachable, none twice


def test_each_mode_names_a_worker_module_that_exists() -> None:
    for _, _, cfg in configs():
        if cfg is not None:
            module = mode_for(cfg).worker_module(cfg)
            assert importlib.util.find_spec(module) is not None, module
    assert issubclass(MODES[-1], Mode) and all(issubclass(m, Mode) for m in MODES)
