"""The figure a node reports after the consensus finish is of the model it ends with: on
reaching agreement the daemon asks its worker to evaluate again (pipe message ``Evaluate``).
Real daemons on loopback with the torch-free stub worker; tests/test_consensus.py checks the
same with real torch workers on skewed shards."""

from __future__ import annotations

import subprocess
import sys

import pytest
from daemon_util import metrics_text, sample_value
from nodes import STUB, NodeProc, wait_for

END = [*STUB, "--set", "training.max_samples=12800", "--set", "exchange.consensus_tolerance=0.01"]


def agreed_evaluation(node: NodeProc) -> dict | None:
    """The node's training status once it is done, agrees, and reports the agreed model's figure."""
    s = node.status()
    t = s["training"]
    return t if t["done"] and s["consensus"]["reached"] and t["eval_consensus"] else None


@pytest.mark.timeout(120)
def test_agreement_brings_an_evaluation_of_the_agreed_model(cluster) -> None:
    a = cluster("a", extra=END)
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=END)
    for n in (a, b):
        t = wait_for(lambda n=n: agreed_evaluation(n), 90, f"{n.name} to evaluate the agreed model")
        assert t["eval_step"] == t["step"], t  # after the last step: the model as it ends
        # the same figure in the metrics and, said so, in the log
        assert sample_value(metrics_text(n.addr), "p2pnode_test_accuracy_ratio") == pytest.approx(t["accuracy"])
        assert "the model agreed on (consensus finish)" in n.log_path.read_text()
        assert n.status()["exchanges"]["done"] > 0
    # and p2pnode status, as an operator reads it
    shown = subprocess.run([sys.executable, "-m", "p2pnode", "status", a.addr], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "(the model agreed on: consensus finish)" in shown.stdout, shown.stdout
    assert "consensus reached  largest distance" in shown.stdout, shown.stdout


@pytest.mark.timeout(60)
def test_a_node_alone_keeps_its_end_of_training_figure(cluster) -> None:
    # nobody to agree with: agreement is immediate and nothing was averaged after training, so
    # the figure taken when training ended is already the model's
    a = cluster("a", extra=END)
    a.wait_ready()
    wait_for(lambda: (s := a.status())["training"]["done"] and s["consensus"]["reached"]
             and s["training"]["eval_step"] == s["training"]["step"], 60, "a to finish and evaluate")
    assert a.status()["training"]["eval_consensus"] is False
    assert "the model agreed on" not in a.log_path.read_text()
