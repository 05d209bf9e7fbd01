"""Shared fixtures: real ``p2pnode start`` processes on loopback (helpers in nodes.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_peer import FakePeer
from nodes import NodeProc


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., NodeProc]]:
    """Factory: ``cluster("a", seeds=[...], extra=[...])`` starts a node; all are stopped after."""
    nodes: list[NodeProc] = []

    def start(name: str, seeds: list[str] | None = None, extra: list[str] | None = None,
              port: int | None = None) -> NodeProc:
        node = NodeProc(tmp_path, name, seeds or [], extra or [], port).start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        for node in nodes:
            sys.stderr.write(f"\n----- log of {node.name} -----\n{node.log()[-6000:]}\n")


# Modules whose tests train real torch workers in several daemons at once: each keeps a core or
# two busy for 10-30 s. scripts/test.sh runs the suite on two pytest-xdist workers
# (--dist loadgroup); these run one after another on one of them, so that two such clusters never
# share the machine's cores (tests tuned on a loaded machine, not on one loaded twice over), while
# the other worker runs the rest: unit tests and daemons that mostly wait on the network. A test
# of such a module that trains no torch worker (a stub worker, a command that exits) is marked
# ``beside_clusters`` and runs on either worker.
TRAINING_CLUSTERS = {"test_big_models.py", "test_tasks_cluster.py", "test_cluster.py", "test_poisoned_peer.py", "test_sync_mode.py",
                     "test_consensus.py", "test_restart_finished.py", "test_ps_mode.py",
                     "test_divergence_daemon.py", "test_adaptive_gossip.py"}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    for item in items:  # before xdist's hook, which reads the mark into the node id
        if item.path.name in TRAINING_CLUSTERS and not item.get_closest_marker("beside_clusters"):
            item.add_marker(pytest.mark.xdist_group("training_clusters"))
    yield
    # pytest 9.2 takes a node id from item._id, and xdist 3.8 still writes its "@group" suffix to
    # item._nodeid, where it changes nothing: --dist loadgroup silently ran the group's tests on
    # both workers (pytest-dev/pytest-xdist#1386). Carry the suffix over to the id it reads.
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # an older pytest: the node id is item._nodeid itself
        return
    for item in items:
        legacy = item.__dict__.get("_nodeid")
        if isinstance(legacy, str) and legacy != item.nodeid:
            item._id = NodeId.parse(legacy)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def fake_peer() -> Iterator[Callable[[str], FakePeer]]:
    """Factory: ``fake_peer("slow-304")`` starts a misbehaving peer (tests/fake_peer.py); all are
    stopped after the test."""
    made: list[FakePeer] = []

    def make(attack: str) -> FakePeer:
        made.append(FakePeer(attack).start())
        return made[-1]

    yield make
    for f in made:
        f.stop()
