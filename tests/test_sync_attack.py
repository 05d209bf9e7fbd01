"""The synchronous mode's hostile member used by ``scripts/bench_poison.py --sync-outlier``
(benchlib/sync_attack): an interpreter started with that folder on its path makes every
contribution of its PowerSGD phases the honest one times ``P2P_SYNC_ATTACK``, and one started
without it is honest. Real interpreters, the real module: the benchmark's attack figures stand on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchlib.poison import SYNC_ATTACK

PROBE = """
import json, numpy as np, torch
from p2pnode.sync.worker_powersgd import PowerSync
from p2pnode.sync.values import decode, encode
torch.manual_seed(0)
named = [("w", torch.randn(16, 12)), ("b", torch.randn(16))]
grads = {n: torch.randn_like(t) for n, t in named}
out = []
for _ in range(2):  # a second instance: the patch holds for the class, not one object
    sync = PowerSync(named, rank=2, seed=0, values="float16")
    p0 = decode(sync.phase0(grads), "float16")
    mean0 = encode(np.linspace(-1, 1, p0.size), "float16")  # the same phase-0 mean for both interpreters
    p1 = decode(sync.phase1(mean0), "float16")
    out.append([p0.tolist(), p1.tolist()])
print(json.dumps(out))
"""


def run(env: dict[str, str]) -> list:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=True)
    return json.loads(proc.stdout)


def test_the_attacking_interpreter_scales_every_phase_and_an_honest_one_does_not() -> None:
    scale = -3.0
    path = os.environ.get("PYTHONPATH", "")
    honest = run({})
    hostile = run({"PYTHONPATH": f"{SYNC_ATTACK}{os.pathsep + path if path else ''}", "P2P_SYNC_ATTACK": repr(scale)})
    assert len(honest) == len(hostile) == 2
    for (h0, h1), (a0, a1) in zip(honest, hostile):
        assert any(abs(v) > 0.01 for v in h0) and any(abs(v) > 0.01 for v in h1)
        # float16 on the wire both times: the scaled values, rounded again
        assert a0 == pytest.approx([scale * v for v in h0], rel=2e-3, abs=1e-3 * abs(scale))
        assert a1 == pytest.approx([scale * v for v in h1], rel=2e-3, abs=1e-3 * abs(scale))
