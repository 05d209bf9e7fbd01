"""benchlib/paired.py's statistics: McNemar's exact test and the paired counts, checked against
exact rational arithmetic (the study that uses them judges the per-run gaps to DDP)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchlib.paired import compare, mcnemar_exact


def exact_p(b: int, c: int) -> float:
    m, k = b + c, min(b, c)
    tail = Fraction(sum(math.comb(m, i) for i in range(k + 1)), 2 ** m)
    return float(min(Fraction(1), 2 * tail))


@given(st.integers(0, 400), st.integers(0, 400))
def test_mcnemar_matches_exact_rational_arithmetic(b: int, c: int) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(exact_p(b, c), rel=1e-9, abs=1e-300)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)


def test_mcnemar_known_values() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(300, 240) < 0.05 < mcnemar_exact(300, 260)  # 60 of 540: beyond chance; 40: not
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def test_compare_counts_the_images_only_one_model_gets_right() -> None:
    a = np.array([1, 1, 0, 0, 1, 1], dtype=bool)
    b = np.array([1, 0, 1, 0, 0, 1], dtype=bool)
    p = compare(a, b)
    assert (p.n, p.only_a, p.only_b) == (6, 2, 1)
    assert p.acc_a == pytest.approx(4 / 6) and p.acc_b == pytest.approx(3 / 6)
    assert p.gap_pt == pytest.approx(100 * 1 / 6)
    assert p.chance_sd_pt == pytest.approx(100 * math.sqrt(3) / 6)
    with pytest.raises(ValueError):
        compare(a, b[:5])


def test_correct_reads_final_models_as_the_benchmarks_leave_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two models saved as a p2pnode checkpoint (as a node's state dir and benchlib.ddp's
    ``--ddp-save`` folders hold them): per-image results that add up to each model's accuracy."""
    import torch

    from benchlib.paired import correct
    from benchlib.steplog import evaluate
    from p2pnode import checkpoint
    from p2pnode.data import fashion_mnist
    from p2pnode.models import build_model

    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model("cnn")
        checkpoint.save(tmp_path / f"m{seed}" / checkpoint.CHECKPOINT_NAME, {"model": model.state_dict()})
        models.append(model)
    rights = correct([tmp_path / "m0", tmp_path / "m1"], limit=1500)  # a part: a full pass takes seconds
    test = fashion_mnist(False)
    for model, right in zip(models, rights, strict=True):
        assert right.shape == (1500,) and right.dtype == bool
        assert right.mean() == pytest.approx(evaluate(model, test, 1500))
    p = compare(rights[0], rights[1])
    assert p.only_a + p.only_b > 0  # two random models disagree somewhere
    with pytest.raises(FileNotFoundError):
        correct([tmp_path / "missing"], limit=10)
