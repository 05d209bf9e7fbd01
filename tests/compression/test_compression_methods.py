"""Per-method properties: DGC / RGC / Gaussian-k counts, unbiasedness, bit packing, signs,
PowerSGD, Strom, casts, and compressor state through state_dict."""

from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.compression import build, build_sparsifier, decode, encode, payload_bytes
from p2pnode.compression.base import kept_count
from p2pnode.compression.packing import pack_bits, pack_uint, unpack_bits, unpack_uint
from tests.compression.samples import samples


def _data(kind: str, n: int = 200_000, seed: int = 0) -> torch.Tensor:
    """Laplace, Gaussian or Student-t(3) samples (any kind but the first two: Student-t)."""
    return samples(kind if kind in ("laplace", "gaussian") else "student3", n, seed)


# ----------------------------------------------------------------- estimator counts

@pytest.mark.parametrize("kind, density", [("laplace", 0.01), ("laplace", 0.001),
                                           ("gaussian", 0.01), ("student3", 0.01),
                                           ("student3", 0.001)])
def test_dgc_count_within_its_correction_band(kind: str, density: float) -> None:
    """Correction loop brings the count into [0.7k, 1.3k]; hierarchical top-k caps it at k."""
    x = _data(kind, seed=1)
    s = build_sparsifier(f"dgc:density={density}")
    k = kept_count(x.numel(), density)
    for _ in range(5):
        idx = s.select(x)
        assert 0.7 * k <= idx.numel() <= k
        assert idx.unique().numel() == idx.numel()


def test_dgc_sampling_is_unstable_on_light_tails() -> None:
    """Known limitation (seed 001's point against sampling): at 0.1 % of 200 k Gaussian values
    the 1 % sample holds ~2 elements above the threshold, and the x1.3 / x0.7 loop can end
    outside its band. Still never more than k (hierarchical), never empty."""
    x = _data("gaussian", seed=1)
    s = build_sparsifier("dgc:density=0.001")
    counts = [s.select(x).numel() for _ in range(40)]
    assert all(1 <= c <= 200 for c in counts)
    assert min(counts) < 0.7 * 200  # the instability is real ...
    assert sum(c >= 0.7 * 200 for c in counts) >= 20  # ... but not the common case


def test_dgc_on_cnn_gradients(cnn_grads) -> None:
    s = build_sparsifier("dgc:density=0.01")
    for g in cnn_grads.values():
        if g.numel() >= 10_000:
            k = kept_count(g.numel(), 0.01)
            assert 0.7 * k <= s.select(g.reshape(-1)).numel() <= k


@pytest.mark.parametrize("kind", ["laplace", "gaussian", "student3"])
def test_rgc_is_exact_topk(kind: str) -> None:
    x = _data(kind, seed=2)
    for density in (0.01, 0.001, 0.4):
        idx = build_sparsifier(f"rgc:density={density}").select(x)
        k = kept_count(x.numel(), density)
        assert idx.numel() == k
        assert torch.equal(x.abs()[idx].sort().values, x.abs().topk(k).values.sort().values)


def test_rgc_on_cnn_gradients(cnn_grads) -> None:
    for g in cnn_grads.values():
        flat = g.reshape(-1)
        k = kept_count(flat.numel(), 0.01)
        idx = build_sparsifier("rgc:density=0.01").select(flat)
        assert idx.numel() == k
        assert flat.abs()[idx].min() >= flat.abs().topk(k).values.min()


@pytest.mark.parametrize("density", [0.01, 0.001])
def test_gaussiank_within_band_on_gaussian(density: float) -> None:
    """Shi et al.'s loop targets [2k/3, 4k/3]; on Gaussian data the fit needs no correction."""
    x = _data("gaussian", seed=3)
    k = kept_count(x.numel(), density)
    n = build_sparsifier(f"gaussiank:density={density}").select(x).numel()
    assert 2 * k / 3 <= n <= 4 * k / 3


def test_gaussiank_keeps_a_threshold_set(cnn_grads) -> None:
    g = cnn_grads["classifier.1.weight"].reshape(-1)
    idx = build_sparsifier("gaussiank:density=0.01").select(g)
    k = kept_count(g.numel(), 0.01)
    assert k / 4 <= idx.numel() <= 4 * k  # no tolerance promised off-Gaussian: same order only
    rest = torch.ones_like(g, dtype=torch.bool)
    rest[idx] = False
    assert (g - g.mean()).abs()[idx].min() >= (g - g.mean()).abs()[rest].max()


# ------------------------------------------------------------------------ unbiasedness

def _mean_over_draws(spec: str, x: torch.Tensor, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    comp = build(spec)
    outs = torch.stack([comp.decompress(*comp.compress(x)) for _ in range(draws)]).double()
    return outs.mean(0), outs.std(0)


@pytest.mark.parametrize("spec", ["qsgd:levels=4,bucket=64", "qsgd:levels=1,bucket=32",
                                  "randomk:density=0.25", "terngrad"])
def test_unbiased_within_statistical_bound(spec: str) -> None:
    """|mean of R draws - x| <= 5 standard errors, elementwise, and the estimator does vary."""
    g = torch.Generator().manual_seed(7)
    # magnitudes >= 0.3 so that every element is sent often enough for its sample std to show
    x = torch.randn(64, generator=g).sign() * (0.3 + torch.rand(64, generator=g) * 2)
    draws = 3000
    mean, std = _mean_over_draws(spec, x, draws)
    se = std / math.sqrt(draws)
    assert (std > 0).any()
    assert ((mean - x.double()).abs() <= 5 * se + 1e-6).all(), spec
    # and a biased compressor fails the same check (the test can fail)
    if spec.startswith("randomk"):
        m2, s2 = _mean_over_draws("randomk:density=0.25,scale=false", x, 500)
        assert not ((m2 - x.double()).abs() <= 5 * s2 / math.sqrt(500) + 1e-6).all()


def test_randomk_shared_seed_sends_no_indices() -> None:
    x = torch.randn(100_000)
    comp = build("randomk:density=0.01,seed=42")
    payload, ctx = comp.compress(x)
    assert set(payload) == {"seed", "k", "v"}
    assert payload_bytes(payload) < 1000 * 4 + 64
    receiver = build("randomk:density=0.01,seed=42")  # another process, same seed rule
    y = receiver.decompress(decode(encode(payload)), ctx)
    idx = torch.nonzero(y).view(-1)
    assert idx.numel() == 1000
    assert torch.allclose(y[idx], x[idx] * 100)
    p2, _ = comp.compress(x)
    assert p2["seed"] != payload["seed"]  # fresh indices every call


def test_qsgd_codes_are_packed() -> None:
    x = torch.randn(4096)
    payload, _ = build("qsgd:levels=16,bucket=512").compress(x)
    assert payload["c"].numel() == 4096 * 6 // 8  # 33 signed levels -> 6 bits
    assert payload["n"].numel() == 8
    payload, _ = build("qsgd:levels=1").compress(x)
    assert payload["c"].numel() == 4096 * 2 // 8


def test_qsgd_quantizes_to_levels() -> None:
    x = torch.randn(512)
    y = build("qsgd:levels=4,bucket=512").decompress(*build("qsgd:levels=4,bucket=512").compress(x))
    norm = torch.linalg.vector_norm(x)
    lv = y / norm * 4
    assert torch.allclose(lv, lv.round(), atol=1e-4)
    assert (torch.sign(y) * torch.sign(x) >= 0).all()


# -------------------------------------------------------------------- bit packing

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.lists(st.integers(0, 255), max_size=70))
def test_pack_uint_roundtrip(width: int, values: list[int]) -> None:
    codes = torch.tensor([v % (1 << width) for v in values], dtype=torch.uint8)
    packed = pack_uint(codes, width)
    assert packed.dtype == torch.uint8
    assert packed.numel() == math.ceil(len(values) * width / 8)
    assert torch.equal(unpack_uint(packed, width, len(values)), codes)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), max_size=100))
def test_pack_bits_roundtrip(bits: list[bool]) -> None:
    mask = torch.tensor(bits, dtype=torch.bool)
    packed = pack_bits(mask)
    assert packed.numel() == math.ceil(len(bits) / 8)
    assert torch.equal(unpack_bits(packed, len(bits)), mask)


def test_pack_bits_layout_is_little_endian() -> None:
    assert pack_bits(torch.tensor([True] + [False] * 7 + [False, True])).tolist() == [1, 2]
    assert pack_uint(torch.tensor([0, 1, 2, 3], dtype=torch.uint8), 2).tolist() == [0b11100100]


# ----------------------------------------------------------------------------- signs

def test_signsgd_one_bit_per_element() -> None:
    x = torch.randn(1000)
    payload, ctx = build("signsgd").compress(x)
    assert payload["s"].numel() == 125
    y = build("signsgd").decompress(payload, ctx)
    assert torch.equal(y, torch.where(x < 0, -1.0, 1.0))


def test_ef_signsgd_scale_is_mean_magnitude() -> None:
    x = torch.randn(1000)
    y = build("ef-signsgd").decompress(*build("ef-signsgd").compress(x))
    assert torch.allclose(y.abs(), x.abs().mean().expand(1000))
    assert torch.equal(torch.sign(y), torch.where(x < 0, -1.0, 1.0))


def test_onebit_reconstructs_row_means() -> None:
    x = torch.tensor([[1.0, 3.0, -2.0, -4.0], [0.5, -1.0, -1.0, 2.5]])
    y = build("onebit").decompress(*build("onebit").compress(x))
    assert torch.allclose(y, torch.tensor([[2.0, 2.0, -3.0, -3.0], [1.5, -1.0, -1.0, 1.5]]))
    assert torch.allclose(y.sum(1), x.sum(1))  # per-row sum preserved


def test_terngrad_values_and_packing() -> None:
    x = torch.randn(1001)
    payload, ctx = build("terngrad").compress(x)
    assert payload["c"].numel() == math.ceil(1001 / 4)
    y = build("terngrad").decompress(payload, ctx)
    s = x.abs().max()
    assert set(torch.unique(y / s).round().tolist()) <= {-1.0, 0.0, 1.0}
    assert ((y == 0) | (torch.sign(y) == torch.sign(x))).all()
    assert (build("terngrad:clip=2.5").compress(x)[0]["s"]) < float(s)


def test_strom_sends_sign_times_tau() -> None:
    x = torch.tensor([0.1, -2.0, 3.0, -0.5, 1.0])
    y = build("strom:tau=1.0").decompress(*build("strom:tau=1.0").compress(x))
    assert torch.equal(y, torch.tensor([0.0, -1.0, 1.0, 0.0, 1.0]))


# --------------------------------------------------------------------------- casts

def test_fp16_saturates_and_bf16_keeps_range() -> None:
    x = torch.tensor([1e6, -1e6, 1.0])
    y = build("fp16").decompress(*build("fp16").compress(x))
    assert torch.isfinite(y).all() and y[0] == 65504.0
    z = build("bf16").decompress(*build("bf16").compress(x))
    assert torch.allclose(z, x, rtol=1e-2)


# ------------------------------------------------------------------------- PowerSGD

def test_powersgd_exact_on_low_rank_and_conv_shapes() -> None:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(60, 2, generator=g) @ torch.randn(2, 80, generator=g)
    comp = build("powersgd:rank=2")
    payload, ctx = comp.compress(m, "fc")
    assert set(payload) == {"p", "q"} and payload["p"].shape == (60, 2)
    assert torch.allclose(comp.decompress(payload, ctx), m, atol=1e-4)
    conv = torch.randn(64, 32, 3, 3, generator=g)
    payload, ctx = comp.compress(conv, "conv")
    assert payload["q"].shape == (32 * 9, 2)
    assert comp.decompress(payload, ctx).shape == conv.shape
    bias = torch.randn(64)
    payload, _ = comp.compress(bias, "bias")
    assert set(payload) == {"x"}  # vectors go dense


def test_powersgd_warm_start_converges() -> None:
    g = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(100, 100, generator=g))
    v, _ = torch.linalg.qr(torch.randn(100, 100, generator=g))
    m = u @ torch.diag(0.5 ** torch.arange(100.0)) @ v.T  # fast-decaying spectrum
    best = u[:, :2] @ torch.diag(torch.tensor([1.0, 0.5])) @ v[:, :2].T
    warm, cold = build("powersgd:rank=2"), build("powersgd:rank=2,warm_start=false")
    for _ in range(6):
        ew = (warm.decompress(*warm.compress(m, "w")) - m).norm()
        ec = (cold.decompress(*cold.compress(m, "w")) - m).norm()
    assert ew <= (best - m).norm() * 1.001
    assert ew < ec


# ---------------------------------------------------------------------- state dicts

@pytest.mark.parametrize("spec", ["powersgd:rank=2", "qsgd", "terngrad", "dgc:density=0.01",
                                  "randomk:density=0.1"])
def test_compressor_state_survives_state_dict(spec: str) -> None:
    gen = torch.Generator().manual_seed(9)
    xs = [torch.randn(50, 60, generator=gen) for _ in range(4)]
    a = build(spec)
    for x in xs[:2]:
        a.compress(x, "w")
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = build(spec)
    b.load_state_dict(torch.load(buf, weights_only=True))
    for x in xs[2:]:
        pa, ca = a.compress(x, "w")
        pb, cb = b.compress(x, "w")
        assert torch.equal(a.decompress(pa, ca), b.decompress(pb, cb))
    fresh = build(spec)
    pf, cf = fresh.compress(xs[3], "w")
    assert not torch.equal(fresh.decompress(pf, cf), b.decompress(pb, cb))  # state mattered
