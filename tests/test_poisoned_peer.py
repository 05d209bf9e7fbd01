"""One member of four serves a sign-flipped model (benchlib/poison.py: a proxy in front of a real
node, which its peers verify and keep as a member). With robust averaging (the default) the
three honest nodes end near the attack-free run and refuse the poisoned models as outliers;
without it (exchange.robust = none) the same attack wrecks them, so this test can fail.

4 real torch nodes on Fashion-MNIST, 4000 samples each, three runs: slow."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from benchlib.cluster import NodeResult
from benchlib.poison import train_attacked

pytestmark = pytest.mark.slow

SAMPLES = 4000


def honest_median(res_rows: list[NodeResult], attacker: int = 3) -> float:
    accs = [r.accuracy for r in res_rows if r.node != attacker and r.accuracy is not None]
    assert len(accs) == attacker, res_rows  # every honest node left a checkpoint
    return statistics.median(accs)


@pytest.mark.timeout(900)
def test_one_sign_flipping_member_of_four_leaves_the_honest_nodes_near_the_attack_free_run(tmp_path: Path) -> None:
    base, _ = train_attacked("base", tmp_path, 4, SAMPLES, "none", port=7661, timeout=300)
    attacked, served = train_attacked("clip", tmp_path, 4, SAMPLES, "sign-flip", port=7671, timeout=300)
    undefended, _ = train_attacked("none", tmp_path, 4, SAMPLES, "sign-flip", ["--set", "exchange.robust=none"],
                                   port=7681, timeout=300)
    b, a, u = honest_median(base.rows), honest_median(attacked.rows), honest_median(undefended.rows)
    assert served > 0
    print(f"honest median: attack-free {b:.4f}, sign-flip with clipping {a:.4f}, without {u:.4f}")
    # two of the honest nodes meet the attacker (exponential graph over sorted ids): they refused
    # its models as outliers
    assert sum(r.outliers > 0 for r in attacked.rows if r.node != 3) >= 2, attacked.rows
    assert sum(r.outliers for r in base.rows) == 0, base.rows  # honest models are never refused
    assert a >= b - 0.02, (b, a)
    assert u <= b - 0.10, (b, u)  # without robust averaging the attack does real damage
