"""What each sparsifier keeps: exact for top-k / mean threshold, within tolerance for the
estimators, on Laplace, Gaussian and real CNN gradients."""

from __future__ import annotations

import pytest
import torch

from p2pnode.compression import build_sparsifier
from p2pnode.compression.base import kept_count
from p2pnode.compression.ldte import LDTEBS
from tests.compression.samples import samples

N = 200_000


def _data(kind: str, n: int = N, seed: int = 0) -> torch.Tensor:
    return samples(kind, n, seed)


@pytest.mark.parametrize("density", [0.01, 0.001, 0.3])
def test_topk_keeps_exactly_the_k_largest(density: float) -> None:
    x = _data("laplace")
    s = build_sparsifier(f"topk:density={density}")
    idx = s.select(x)
    k = kept_count(N, density)
    assert idx.numel() == k and idx.unique().numel() == k
    kept = x.abs()[idx]
    others = torch.ones(N, dtype=torch.bool)
    others[idx] = False
    assert kept.min() >= x.abs()[others].max()
    assert torch.equal(kept.sort().values, x.abs().topk(k).values.sort().values)


def test_mean_threshold_keeps_exactly_at_or_above_mean_magnitude(cnn_grads) -> None:
    s = build_sparsifier("mean-threshold")
    for name, g in cnn_grads.items():
        flat = g.reshape(-1)
        idx = s.select(flat)
        expect = torch.nonzero(flat.abs() >= flat.abs().mean()).view(-1)
        assert torch.equal(idx, expect), name
        # negative entries survive (the signed mean would drop them all)
        if flat.numel() > 100:
            assert (flat[idx] < 0).any() and (flat[idx] > 0).any()
        assert torch.equal(s.mask(g), g.abs() >= g.abs().mean())


def test_mean_threshold_keeps_about_a_third_of_laplace() -> None:
    idx = build_sparsifier("mean-threshold").select(_data("laplace"))
    assert abs(idx.numel() / N - 0.3679) < 0.01  # exp(-1)


def _check_within(spec: str, x: torch.Tensor, tol: float) -> int:
    s = build_sparsifier(spec)
    idx = s.select(x)
    k = kept_count(x.numel(), s.density)
    assert idx.unique().numel() == idx.numel()
    count = idx.numel()
    assert abs(count - k) <= tol * k + 1, (spec, count, k)
    # a threshold rule: everything kept is at least as large as everything dropped
    others = torch.ones(x.numel(), dtype=torch.bool)
    others[idx] = False
    if others.any():
        assert x.abs()[idx].min() >= x.abs()[others].max()
    return count


@pytest.mark.parametrize("kind", ["laplace", "gaussian", "student3"])
@pytest.mark.parametrize("density", [0.01, 0.001, 0.1])
def test_ldte_bs_within_tolerance_on_synthetic(kind: str, density: float) -> None:
    _check_within(f"ldte-bs:density={density},tol=0.05", _data(kind), 0.05)


@pytest.mark.parametrize("density", [0.01, 0.001])
def test_ldte_bs_within_tolerance_on_cnn_gradients(cnn_grads, density: float) -> None:
    for name, g in cnn_grads.items():
        if g.numel() >= 1000:
            _check_within(f"ldte-bs:density={density},tol=0.05", g.reshape(-1), 0.05)
    whole = torch.cat([g.reshape(-1) for g in cnn_grads.values()])
    _check_within(f"ldte-bs:density={density},tol=0.02", whole, 0.02)


def test_ldte_bs_plain_laplace_fit_is_close_on_laplace_and_off_on_gaussian() -> None:
    """The un-corrected estimate (steps 1-2) is what the correction is for."""
    k = kept_count(N, 0.01)
    lap = build_sparsifier("ldte:density=0.01").select(_data("laplace")).numel()
    gau = build_sparsifier("ldte:density=0.01").select(_data("gaussian")).numel()
    assert abs(lap - k) < 0.1 * k
    assert gau < 0.2 * k  # Gaussian tails are lighter: the Laplace key point keeps far too few


def test_ldte_bs_first_probe_hits_on_laplace() -> None:
    s = LDTEBS(density=0.01, tol=0.05)
    s.select(_data("laplace", seed=4))
    assert s.stats["probes"] == 1 and not s.stats["fallback"]


def test_ldte_bs_ties_fall_back_to_exact_k() -> None:
    """Many equal magnitudes: no threshold hits k, exact top-k on the bracket finishes."""
    x = torch.randint(-3, 4, (50_000,), generator=torch.Generator().manual_seed(2)).float()
    s = LDTEBS(density=0.05, tol=0.01)
    idx = s.select(x)
    assert idx.numel() == kept_count(50_000, 0.05)
    assert x.abs()[idx].min() == 3.0
    assert s.stats["fallback"]


@pytest.mark.parametrize("spec", ["ldte-bs", "topk", "dgc", "rgc", "gaussiank", "ldte"])
def test_estimators_handle_degenerate_tensors(spec: str) -> None:
    s = build_sparsifier(f"{spec}:density=0.01")
    assert s.select(torch.zeros(1000)).numel() >= 1 or spec in ("gaussiank", "ldte")
    assert s.select(torch.ones(1)).tolist() == [0]
    idx = s.select(torch.tensor([0.0, -5.0, 0.0]))
    assert 1 in idx.tolist()
