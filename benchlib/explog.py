"""The log of scripts/experiment.py, read back for scripts/experiment_report.py: its runs
(``Run``: per-node samples and the result record), its conditions (``Condition``: what each
capped, and which runs of another condition stand in for the systems it did not run), and the
figures derived from a run (seconds per batch, accuracy against time, final losses).

Reads only the log: no torch, no network.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

NAMES = {"single": "single process", "ps": "parameter server (p2pnode ps)",
         "ps-m09": "parameter server, server momentum 0.9", "ps-m06": "parameter server, server momentum 0.6",
         "ddp": "DDP (gloo)", "hivemind": "hivemind", "p2p-paper": "p2pnode, the paper's settings",
         "p2p-defaults": "p2pnode defaults"}
ORDER = list(NAMES)
#: the test accuracies marked on the accuracy-against-time figures (the tables give the times to reach them)
TARGETS = (0.85, 0.88)


@dataclass
class Run:
    name: str
    system: str
    cond: str
    result: dict[str, Any] = field(default_factory=dict)
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def roles(self) -> dict[int, str]:
        return {n["node"]: n.get("role", "worker") for n in self.result.get("nodes", [])}

    def workers(self) -> list[int]:
        """The nodes that train batches (a parameter server's workers, not the server)."""
        roles = self.roles()
        return [n for n in sorted(self.samples) if roles.get(n, "worker") == "worker"]

    def judged(self) -> list[dict[str, Any]]:
        """The final models that stand for the system: the server's for a PS, else every node's."""
        nodes = self.result.get("nodes", [])
        server = [n for n in nodes if n.get("role") == "server"]
        return server or nodes

    def batch_seconds(self) -> list[float]:
        """Seconds per batch of every worker: each poll interval's time over the batches in it."""
        out: list[float] = []
        for n in self.workers():
            for a, b in pairwise(self.samples[n]):
                if b["step"] > a["step"]:
                    out += [(b["t"] - a["t"]) / (b["step"] - a["step"])] * (b["step"] - a["step"])
        return out

    def accuracy_curve(self) -> list[tuple[float, float]]:
        """(seconds, test accuracy): the server's for a PS, else the mean of every node's latest."""
        roles = self.roles()
        nodes = [n for n in self.samples if roles.get(n) == "server"] or list(self.samples)
        events = sorted((s["t"], n, s["acc"]) for n in nodes for s in self.samples[n] if s.get("acc") is not None)
        latest: dict[int, float] = {}
        curve = []
        for t, n, acc in events:
            latest[n] = acc
            curve.append((t, statistics.mean(latest.values())))
        return curve

    def time_to(self, target: float) -> float | None:
        return next((t for t, acc in self.accuracy_curve() if acc >= target), None)

    def final_losses(self) -> list[float]:
        """Per node: the mean of its last five logged batch losses (the PS: the server's)."""
        roles = self.roles()
        nodes = [n for n in self.samples if roles.get(n) == "server"] or sorted(self.samples)
        out = []
        for n in nodes:
            losses = [s["loss"] for s in self.samples[n] if s.get("loss") is not None]
            if losses:
                out.append(statistics.mean(losses[-5:]))
        return out


@dataclass
class Condition:
    """A network condition as the log describes it. ``scope``: which links it caps ("none",
    "server": a parameter server's only, "every"); ``capped``: in words, per system;
    ``borrowed``: system -> the condition whose run stands in for it here."""

    name: str
    rate: str = ""
    scope: str = ""
    capped: dict[str, str] = field(default_factory=dict)
    borrowed: dict[str, str] = field(default_factory=dict)


@dataclass
class Log:
    meta: dict[str, Any]
    ratio: dict[str, Any]
    runs: dict[str, Run]
    conds: dict[str, Condition]
    ends: list[dict[str, Any]] = field(default_factory=list)  #: one per command that ran to its end

    def conditions(self) -> list[str]:
        return list(dict.fromkeys([*(r.cond for r in self.runs.values()), *self.conds]))

    def condition(self, cond: str) -> Condition:
        """The log's record of ``cond``; a log without one (older logs): loopback caps nothing,
        any other condition every link."""
        return self.conds.get(cond) or Condition(cond, scope="none" if cond == "loopback" else "every")

    def in_cond(self, cond: str) -> list[Run]:
        """The runs of a condition in report order: its own, the runs that stand in for systems
        it did not run (``borrowed``), and the single process (no network) in every one."""
        chosen = [r for r in self.runs.values() if r.cond == cond]
        have = {r.system for r in chosen}
        for system, other in self.condition(cond).borrowed.items():
            if system not in have and (stand := self.runs.get(f"{other}/{system}")) is not None:
                chosen.append(stand)
        if "single" not in have:
            chosen += [r for r in self.runs.values() if r.system == "single"][:1]
        return sorted(chosen, key=lambda r: ORDER.index(r.system) if r.system in ORDER else 99)


def load(path: Path) -> Log:
    """The log, read: meta (every command's, in ``commands``), the ratio arithmetic, runs,
    conditions and end records."""
    meta: dict[str, Any] = {}
    commands: list[str] = []
    ratio: dict[str, Any] = {}
    runs: dict[str, Run] = {}
    conds: dict[str, Condition] = {}
    ends: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        kind = rec.get("kind")
        if kind == "meta":  # several when runs were appended (--append): the settings are the same
            commands.append(f"{rec.get('command', '?')}  # {rec.get('machine', '')}")
            meta = {**rec, "commands": commands, "systems": [*meta.get("systems", []), *rec.get("systems", [])]}
        elif kind == "ratio":  # a later run given --ratio-rate keeps the measured arithmetic shown
            if "ratio" in rec or "ratio" not in ratio:
                ratio = rec
        elif kind == "condition":
            conds[rec["cond"]] = Condition(rec["cond"], rec.get("rate", ""), rec.get("scope", ""),
                                           rec.get("capped", {}), rec.get("borrowed", {}))
        elif kind == "end":
            ends.append(rec)
        elif kind == "sample":
            cond, _, system = rec["run"].partition("/")
            run = runs.setdefault(rec["run"], Run(rec["run"], system, cond))
            run.samples.setdefault(rec["node"], []).append(rec)
        elif kind == "result":
            run = runs.setdefault(rec["run"], Run(rec["run"], rec["system"], rec["cond"]))
            run.result = rec
    return Log(meta, ratio, runs, conds, ends)


def label(r: Run, cond: str) -> str:
    """A run's row name in ``cond``: its system, and where a run of another condition stands in
    (a system the condition did not run: nothing of it is capped there), which one."""
    name = NAMES.get(r.system, r.system)
    return name if r.cond == cond or r.system == "single" else f"{name} (its {r.cond} run)"
