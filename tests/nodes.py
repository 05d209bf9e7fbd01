"""Real ``p2pnode start`` processes on loopback for tests: ``benchlib.cluster.NodeProc`` with
settings that make a test cluster quick (a small synthetic task, frequent evaluation and
checkpoints, short timeouts).

Imported as ``from nodes import ...`` (not from conftest: pytest loads several conftest
modules, and a bare ``import conftest`` would get whichever came first).
"""

from __future__ import annotations

from pathlib import Path

from benchlib import cluster
from benchlib.status import free_port, get_json, wait_for

__all__ = ["FAST", "STUB", "NodeProc", "free_port", "get_json", "wait_for"]

FAST = [
    "--data", "synthetic",
    "--set", "training.synthetic_samples=2048",
    "--set", "training.eval_every=25",
    "--set", "training.eval_samples=256",
    "--set", "training.lr=0.02",
    "--set", "checkpoint.interval=2",
    "--set", "exchange.timeout=1.0",
    "--set", "membership.gossip_interval=0.3",
    "--set", "membership.timeout=0.5",
    # no settle window before the first step (training.start_settle): a test starts its nodes
    # itself; tests/test_start_settle.py runs the window for real
    "--set", "training.start_settle=0",
]


#: the torch-free worker (p2pnode/worker/stub.py): real pipe, publishing, replicas, averaging and
#: checkpoints, no learning; starts in a fraction of a second. For tests of membership, auth,
#: TLS, HTTP and lifecycle; tests of training itself run the torch worker (the default).
STUB = ["--set", "training.worker=stub"]


class NodeProc(cluster.NodeProc):
    """One real daemon with the FAST settings, then ``extra``; its log is shown when a test fails."""

    def __init__(self, root: Path, name: str, seeds: list[str], extra: list[str], port: int | None = None) -> None:
        super().__init__(root, name, [*FAST, *extra], seeds, port)
