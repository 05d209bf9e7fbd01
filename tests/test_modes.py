"""The registry of modes (p2pnode/modes.py): every configuration the checks accept runs exactly
one mode, and the worker module each names is there to import in the spawned process."""

from __future__ import annotations

import importlib.util

from p2pnode.config import ROLES, Config, ConfigError
from p2pnode.daemon.mode import Mode
from p2pnode.modes import MODES, mode_for



def configs() -> list[tuple[str, str, Config | None]]:
    """(role, sync, the config, or None where the checks refuse it) for every pair, "auto" with a
    cluster secret and without (its two outcomes for a peer)."""
    out = []
    for role in ROLES:
        for sync in ("none", "powersgd", "auto", "auto+secret"):
            data = {"node": {"role": role, "seeds": ["127.0.0.1:9"], "secret": "s" if "secret" in sync else ""},
                    "exchange": {"sync": sync.split("+")[0]}}
            try:
                out.append((role, sync, Config.from_dict(data)))
            except ConfigError:
                out.append((role, sync, None))
    return out


def test_every_accepted_configuration_runs_exactly_one_mode() -> None:
    reached = set()
    for role, sync, cfg in configs():
        if cfg is None:
            assert sync == "powersgd" and role != "peer", (role, sync)  # only that is refused
            continue
        chosen = [m.__name__ for m in MODES if m.chosen(cfg)]
        assert len(chosen) == 1, (role, sync, chosen)
        assert mode_for(cfg).__name__ == chosen[0]
        reached.add(chosen[0])
    assert reached == {m.__name__ for m in MODES}  # gossip, sync, ps, ps-worker: each reachable


def test_each_mode_names_a_worker_module_that_exists() -> None:
    for _, _, cfg in configs():
        if cfg is not None:
            module = mode_for(cfg).worker_module(cfg)
            assert importlib.util.find_spec(module) is not None, module
    assert issubclass(MODES[-1], Mode) and all(issubclass(m, Mode) for m in MODES)
