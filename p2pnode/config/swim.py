"""SWIM settings, with HashiCorp memberlist's defaults (``DefaultLANConfig`` / ``DefaultWANConfig``).

Every duration is in seconds. The LAN profile suits nodes on one switched network (round trips
well under 10 ms); the WAN profile tolerates round trips of a few hundred ms and lossy links at
the price of slower failure detection. See docs/MEMBERSHIP.md for what each knob trades.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SwimConfig:
    # --- failure detection --------------------------------------------------------------
    #: one member is probed per interval (scaled up by the local health multiplier)
    probe_interval: float = 1.0
    #: how long a direct ping waits for its ack before indirect probes start
    probe_timeout: float = 0.5
    #: helpers asked to ping a member that did not answer us (k in the SWIM paper)
    indirect_checks: int = 3
    #: also retry the direct ping while the indirect probes run (memberlist's TCP fallback)
    direct_retry: bool = True
    #: suspicion timeout floor = suspicion_mult * log10(max(n, 1)) * probe_interval
    suspicion_mult: int = 4
    #: the timeout starts at suspicion_max_timeout_mult times the floor and shrinks with
    #: independent confirmations (Lifeguard); suspicion_mult - 2 confirmations reach the floor
    suspicion_max_timeout_mult: int = 6
    #: local health multiplier ceiling (Lifeguard LHM): probes slow down to this many intervals
    awareness_max_multiplier: int = 8

    # --- dissemination ------------------------------------------------------------------
    #: an update is piggybacked retransmit_mult * ceil(log10(n + 1)) times before it is dropped
    retransmit_mult: int = 4
    #: updates waiting in the queue are pushed to gossip_nodes members every gossip_interval
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    #: dead members still get gossip this long, so they learn they were declared dead and refute
    gossip_to_the_dead_time: float = 30.0
    #: full state exchange with one random member (and one dead one, to heal partitions);
    #: scaled up by ceil(log2(n / 32)) + 1 above 32 members, as memberlist does
    push_pull_interval: float = 30.0
    #: longest a push-pull (full state exchange) may take
    push_pull_timeout: float = 5.0

    # --- join / leave / tombstones ------------------------------------------------------
    #: each seed contact may take this long
    join_timeout: float = 2.0
    #: passes over the seed list before join() gives up with JoinError
    join_attempts: int = 5
    #: back-off between passes: starts here, doubles, capped at join_backoff_max (with jitter)
    join_backoff: float = 0.5
    join_backoff_max: float = 8.0
    #: leave() spends at most this long telling others
    leave_timeout: float = 1.5
    #: dead members are kept (and retried by push-pull, to heal partitions) this long
    dead_reap_time: float = 24 * 3600.0
    #: left members are kept as tombstones this long, so stale gossip cannot revive them
    left_reap_time: float = 24 * 3600.0

    # --- bounds -------------------------------------------------------------------------
    #: byte budget of the updates piggybacked on one probe or gossip message
    max_piggyback_bytes: int = 1400
    #: largest membership message accepted or sent, push-pull excepted
    max_message_bytes: int = 64 * 1024
    #: largest push-pull message (a full member list)
    max_push_pull_bytes: int = 4 * 1024 * 1024
    #: members beyond this are ignored (bounds memory and push-pull size)
    max_members: int = 16384

    # --- strangers (docs/MEMBERSHIP.md, "Hostile input") ----------------------------------
    #: unknown members one received message may propose (replies to our own push-pulls, to a
    #: seed or a member we chose, are bounded by max_unverified only)
    max_new_per_message: int = 64
    #: proposed members waiting for their verification probe, in all and per source
    max_unverified: int = 512
    max_unverified_per_source: int = 128
    #: verification probes started per second at most, and outstanding at most
    verify_rate: float = 50.0
    verify_in_flight: int = 16
    #: an address whose verification failed is not probed again for this long
    verify_retry_after: float = 10.0
    #: an incarnation more than this above the one we know (of a member, or our own) is refused
    max_incarnation_jump: int = 1024
    #: live members' addresses saved for the next start (members.json), at most
    max_remembered: int = 64

    def __post_init__(self) -> None:
        problems = []
        for name in ("probe_interval", "probe_timeout", "gossip_interval", "push_pull_interval",
                     "push_pull_timeout", "join_timeout", "join_backoff", "join_backoff_max", "leave_timeout",
                     "verify_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive number of seconds, got {value!r}")
        if self.probe_timeout >= self.probe_interval:
            problems.append("probe_timeout must be shorter than probe_interval")
        for name, low in (("indirect_checks", 0), ("suspicion_mult", 1), ("suspicion_max_timeout_mult", 1),
                          ("awareness_max_multiplier", 1), ("retransmit_mult", 1), ("gossip_nodes", 1),
                          ("join_attempts", 1), ("max_piggyback_bytes", 128), ("max_message_bytes", 1024),
                          ("max_push_pull_bytes", 1024), ("max_members", 2), ("max_new_per_message", 1),
                          ("max_unverified", 1), ("max_unverified_per_source", 1), ("verify_in_flight", 1),
                          ("max_incarnation_jump", 1), ("max_remembered", 0)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= low):
                problems.append(f"{name} must be an integer >= {low}, got {value!r}")
        for name in ("gossip_to_the_dead_time", "dead_reap_time", "left_reap_time", "verify_retry_after"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be >= 0")
        if problems:
            raise ValueError("SwimConfig: " + "; ".join(problems))

    @classmethod
    def lan(cls, **overrides: Any) -> SwimConfig:
        """memberlist's DefaultLANConfig (the defaults of this class)."""
        return cls(**overrides)

    @classmethod
    def wan(cls, **overrides: Any) -> SwimConfig:
        """memberlist's DefaultWANConfig: slower probes, longer timeouts, more suspicion."""
        base: dict[str, Any] = dict(probe_interval=5.0, probe_timeout=3.0, suspicion_mult=6,
                                    push_pull_interval=60.0, push_pull_timeout=30.0, gossip_interval=0.5,
                                    gossip_nodes=4, gossip_to_the_dead_time=60.0, join_timeout=10.0,
                                    leave_timeout=1.8)  # the daemon gives leave() 2 s
        base.update(overrides)
        return cls(**base)

    @classmethod
    def local(cls, **overrides: Any) -> SwimConfig:
        """memberlist's DefaultLocalConfig: one host, fast detection (tests, demos)."""
        base: dict[str, Any] = dict(probe_interval=1.0, probe_timeout=0.2, indirect_checks=1,
                                    retransmit_mult=2, suspicion_mult=3, push_pull_interval=15.0,
                                    gossip_interval=0.1, gossip_to_the_dead_time=15.0)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def profile(cls, name: str, **overrides: Any) -> SwimConfig:
        """``lan``, ``wan`` or ``local`` with overrides; unknown keys raise ValueError."""
        makers = {"lan": cls.lan, "wan": cls.wan, "local": cls.local}
        if name not in makers:
            raise ValueError(f"unknown SWIM profile {name!r}: expected one of {', '.join(makers)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown SWIM setting(s): {', '.join(sorted(unknown))}")
        return makers[name](**overrides)

    # --- derived quantities (memberlist's formulas) --------------------------------------

    def suspicion_timeouts(self, n: int) -> tuple[float, float]:
        """(min, max) suspicion timeout for a cluster of n members."""
        low = self.suspicion_mult * max(1.0, math.log10(max(1, n))) * self.probe_interval
        return low, low * self.suspicion_max_timeout_mult

    def suspicion_confirmations(self, n: int) -> int:
        """Independent confirmations that shrink a suspicion to its floor (0 in tiny clusters)."""
        k = self.suspicion_mult - 2
        return 0 if n - 2 < k else max(0, k)

    def retransmit_limit(self, n: int) -> int:
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def push_pull_period(self, n: int) -> float:
        if n <= 32:
            return self.push_pull_interval
        return self.push_pull_interval * (math.ceil(math.log2(n) - math.log2(32)) + 1)
