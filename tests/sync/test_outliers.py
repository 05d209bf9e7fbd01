"""One contribution far from all the others' (p2pnode/sync/outliers.py, exchange.sync_outlier):
taken as the phase's coordinate-wise median; every other part is left as it came (the same
object: the reducer's sum of them is then the sum without the check, to the bit); with the
check off or fewer than three parts nothing is measured."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.sync.outliers import FLOOR, MIN_PARTS, dot, median, replace_outliers


def honest(n: int, size: int = 4000, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """The network's gradient and ``n`` nodes' noisy estimates of it (noise as large as it)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=size)
    return g, [g + rng.normal(size=size) for _ in range(n)]


@given(st.integers(MIN_PARTS, 9), st.floats(1, 12), st.integers(0, 2**32 - 1), st.floats(-1000, 1000))
@settings(max_examples=60, deadline=None)
def test_outliers_become_the_median_and_every_other_part_is_untouched(n: int, threshold: float, seed: int,
                                                                       scale: float) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.normal(size=50) * rng.uniform(0.1, 10) for _ in range(n)]
    parts[0] = parts[0] * scale
    out, over, largest = replace_outliers(parts, threshold)
    centre = np.median(np.stack(parts), axis=0)
    dist = [float(np.linalg.norm(p - centre)) for p in parts]
    unit = max(float(np.median(dist)), FLOOR * float(np.linalg.norm(centre)))
    assert largest == pytest.approx(max(dist) / unit)
    assert len(over) <= n / 2  # a threshold of 1 or more: never a majority over the median distance
    for i, (before, after) in enumerate(zip(parts, out)):
        if i in over:
            assert np.allclose(after, centre, rtol=1e-12, atol=1e-12) and over[i] == pytest.approx(dist[i] / unit) and over[i] > threshold
        else:
            assert after is before and dist[i] / unit <= threshold * (1 + 1e-12)


@given(st.integers(1, 200_000), st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_the_distances_dot_product_is_blas_s_to_rounding(size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=size), rng.normal(size=size) * rng.choice([1e-6, 1.0, 1e6])
    assert dot(a, b) == pytest.approx(float(a @ b), rel=1e-9, abs=1e-9 * float(np.abs(a) @ np.abs(b)))
    assert dot(a, a) == pytest.approx(float(a @ a), rel=1e-12)


@given(st.integers(MIN_PARTS, 17), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_the_median_is_numpys(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    stack = rng.normal(size=(n, 30)) * rng.choice([1e-6, 1.0, 1e6], size=(n, 1))
    assert np.allclose(median(list(stack)), np.median(stack, axis=0), rtol=1e-9, atol=0)


def test_one_node_sending_its_gradient_negated_and_scaled_up_no_longer_moves_the_mean() -> None:
    g, parts = honest(3)
    attacked = [*parts, -100 * g]
    out, over, largest = replace_outliers(attacked, 8.0)
    assert list(over) == [3] and largest > 50
    plain, mean, fair = np.mean(attacked, axis=0), np.mean(out, axis=0), np.mean(parts, axis=0)
    assert float(plain @ g) < 0 < float(mean @ g)  # without the check the mean points against the gradient
    assert np.linalg.norm(mean - fair) < 0.2 * np.linalg.norm(g) < 0.01 * np.linalg.norm(plain - fair)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_honest_nodes_are_never_outliers(n: int) -> None:
    """Noisy estimates of one gradient lie at about one distance from their median (many
    coordinates): none comes near 8, let alone the default threshold of 20."""
    for seed in range(5):
        _, parts = honest(n, seed=seed)
        out, over, largest = replace_outliers(parts, 8.0)
        assert not over and largest < 2 and out is parts


def test_off_or_too_few_parts_changes_and_measures_nothing() -> None:
    g, parts = honest(4)
    attacked = [*parts[:3], 1000 * g]
    assert replace_outliers(attacked, 0.0) == (attacked, {}, 0.0)
    assert replace_outliers(attacked[2:], 8.0) == (attacked[2:], {}, 0.0)  # two: no majority to say which is off


def test_models_nearly_alike_are_left_alone_and_a_negated_one_is_replaced() -> None:
    """After training (the models' mean) most models are equal to the bit, so the median
    distance is 0: a model that missed a round or two (within FLOOR of the centre) is kept as it
    came, and a negated model is replaced by the others' one."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=1000)
    near = x + 0.002 * np.linalg.norm(x) / np.sqrt(x.size) * rng.normal(size=x.size)
    out, over, largest = replace_outliers([x, x, x, near], 8.0)
    assert not over and out[3] is near and 0 < largest < 1
    out, over, _ = replace_outliers([x, x, x, -x], 8.0)
    assert list(over) == [3] and np.allclose(np.mean(out, axis=0), x, rtol=1e-12, atol=1e-12)
    assert replace_outliers([x, x, x], 8.0)[1:] == ({}, 0.0)
