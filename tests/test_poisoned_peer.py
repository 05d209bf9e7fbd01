"""One member of four serves a sign-flipped model (benchlib/poison.py: a proxy in front of a real
node, which its peers verify and keep as a member). With robust averaging (the default) the
three honest nodes end near the attack-free outcome, refuse the poisoned models as outliers and
never refuse each other's.

The attack is real in this run itself: the proxy served poisoned models (``served > 0``) and at
least two honest nodes measured them beyond the refusal bound (their outlier counts): a proxy that
served honest models would leave those at 0 and fail. What the attack does without a defence is
not run here again (a second cluster, half of this test's time): with ``exchange.robust = none``
these very settings ended at 0.10-0.17 (sign-flip; 10.00 % in docs/BENCHMARKS.md "Poisoned
models"), far under the bar, and tests/test_robust_averaging.py shows the same gossip without
clipping turning the honest models into the poison. So broken robust averaging fails this test by
its accuracy bar, and broken outlier refusal by its outlier counts.

The attack-free outcome is a measured figure, not a third cluster run here (that run took a
third of this test's time): ``ATTACK_FREE`` is the honest median of attack-free runs of these
very settings (4 nodes, ``SAMPLES`` each, the test set's first ``TEST_IMAGES`` images). Broken
robust averaging gives chance (~0.10) and fails the bar by far; a change of the training
defaults that moves the attack-free figure by more than the tolerance fails it too, and then
``ATTACK_FREE`` is measured again (``train_attacked(..., "none", ...)`` with these arguments).

4 real torch nodes on Fashion-MNIST, 4000 samples each, one run; every evaluation (each node's
final one, the test's of each checkpoint) on the first 2000 test images (benchlib.testdata):
the whole test set made evaluation most of the test's time. Slow."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from benchlib.cluster import NodeResult
from benchlib.poison import train_attacked
from benchlib.testdata import fashion_mnist_short_test

pytestmark = pytest.mark.slow

SAMPLES = 4000
TEST_IMAGES = 2000
#: the honest median of attack-free runs of these settings on the first TEST_IMAGES test images
#: (0.7765, 0.7695 and 0.773 here, 2026-11; on the whole test set: 0.771 and 0.772)
ATTACK_FREE = 0.77
#: the nodes start together, as under the default 45 s settle window (training.start_settle),
#: which left them idle 45 s after their workers were ready (more than half of this test's time
#: on an idle machine): 10 s covers the spread of 4 workers loading torch at once (under 3 s
#: here, loaded), and a node whose window ends later starts within a poll of a peer that trains
SETTLE = ("--set", "training.start_settle=10")


def honest_median(res_rows: list[NodeResult], attacker: int = 3) -> float:
    accs = [r.accuracy for r in res_rows if r.node != attacker and r.accuracy is not None]
    assert len(accs) == attacker, res_rows  # every honest node left a checkpoint
    return statistics.median(accs)


@pytest.mark.timeout(600)
def test_one_sign_flipping_member_of_four_leaves_the_honest_nodes_near_the_attack_free_run(tmp_path: Path) -> None:
    data = str(fashion_mnist_short_test(TEST_IMAGES))
    last: dict[int, dict[str, Any]] = {}

    def keep(elapsed: float, statuses: list[dict[str, Any] | None]) -> None:
        last.update({i: s for i, s in enumerate(statuses) if s is not None})

    port = 7671
    attacked, served = train_attacked("clip", tmp_path, 4, SAMPLES, "sign-flip", SETTLE, port=port, timeout=300,
                                      progress=keep, data_dir=data)
    a = honest_median(attacked.rows)
    assert served > 0
    print(f"honest median: sign-flip with clipping {a:.4f} (attack-free: {ATTACK_FREE}); "
          f"outliers refused: {[r.outliers for r in attacked.rows]}")
    # two of the honest nodes meet the attacker (exponential graph over sorted ids): they refused
    # its models as outliers...
    assert sum(r.outliers > 0 for r in attacked.rows if r.node != 3) >= 2, attacked.rows
    # ...and an honest peer's model at most once (each honest node exchanged with one or two of
    # them): an honest copy far twice in a row is refused by the second-strike rule
    # (docs/ALGORITHMS.md; CI saw it once, 1 of 6 exchanges with that peer), a broken refusal
    # refuses them every time
    honest = {f"127.0.0.1:{port + i}" for i in range(3)}
    for i in range(3):
        refused = {p["addr"]: p["outliers"] for p in last[i]["peers"].values() if p["addr"] in honest}
        assert refused and sum(refused.values()) <= 1, (i, last[i]["peers"])
    # 4 pt: attacked runs of these settings ended 0.7575-0.7695 (2026-11-25), attack-free ones
    # 0.7695-0.7765, so 2 pt left a run of noise from failing; a broken defence ends at 0.10-0.17
    assert a >= ATTACK_FREE - 0.04, (ATTACK_FREE, a)
