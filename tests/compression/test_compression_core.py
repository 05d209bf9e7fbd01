"""Interface, registry, wire sizes, pipeline: what the daemon codes against."""

from __future__ import annotations

import io

import pytest
import torch

from p2pnode.compression import (
    CompressionConfigError, Compressor, Ctx, GradientPipeline, Sparsifier, Traits, build,
    build_sparsifier, decode, encode, names, payload_bytes, validate,
)

#: a spec for every name (strom has no default threshold)
ALL_SPECS = [n if n != "strom" else "strom:tau=0.5" for n in names()]


def test_names_cover_the_issue() -> None:
    expected = {"none", "mean-threshold", "topk", "ldte-bs", "dgc", "rgc", "randomk", "strom",
                "gaussiank", "fp16", "bf16", "qsgd", "terngrad", "signsgd", "ef-signsgd",
                "onebit", "powersgd"}
    assert expected <= set(names())


@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("shape", [(64, 3, 5, 5), (300,), (1,), (17, 33)])
def test_roundtrip_shape_dtype_and_wire(spec: str, shape: tuple[int, ...]) -> None:
    comp = build(spec)
    assert isinstance(comp, Compressor) and isinstance(comp.traits, Traits)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    payload, ctx = comp.compress(x, "layer")
    y = comp.decompress(payload, ctx)
    assert y.shape == x.shape and y.dtype == x.dtype
    # the receiver only has the bytes and the tensor's shape/dtype
    wire = encode(payload)
    assert payload_bytes(payload) == len(wire)
    y2 = comp.decompress(decode(wire), Ctx(tuple(shape), torch.float32))
    assert torch.equal(y, y2)
    if comp.traits.sparse:
        assert isinstance(comp, Sparsifier)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_roundtrip_shortcut_matches_compress_decompress(spec: str) -> None:
    """``roundtrip`` (what the pipeline calls; mean-threshold overrides it with a mask multiply)
    gives the same tensor and the exact wire size of the payload."""
    x = torch.randn(123, 45, generator=torch.Generator().manual_seed(4))
    a, b = build(spec), build(spec)  # same seeds: same random draws
    out, nbytes = a.roundtrip(x, "w")
    payload, ctx = b.compress(x, "w")
    assert torch.equal(out, b.decompress(payload, ctx))
    assert nbytes == len(encode(payload))


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "topk:density=0.1", "ldte-bs", "qsgd",
                                  "signsgd", "powersgd", "mean-threshold"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_roundtrip_keeps_other_dtypes(spec: str, dtype: torch.dtype) -> None:
    comp = build(spec)
    x = torch.randn(40, 50).to(dtype)
    payload, ctx = comp.compress(x)
    y = comp.decompress(decode(encode(payload)), ctx)
    assert y.dtype == dtype and y.shape == x.shape


def test_sparse_payloads_are_small_and_dense_payload_is_real() -> None:
    x = torch.randn(100_000)
    dense = payload_bytes(build("none").compress(x)[0])
    assert 400_000 <= dense < 400_100  # 4 bytes a float plus a small header
    top = payload_bytes(build("topk:density=0.01").compress(x)[0])
    assert 8 * 1000 <= top < 8 * 1000 + 100  # int32 index + float32 value per kept element
    fp16 = payload_bytes(build("fp16").compress(x)[0])
    assert 200_000 <= fp16 < 200_100


def test_spec_parsing_and_canonical_spec() -> None:
    c = build("ldte-bs:density=0.001,tol=0.1")
    assert c.density == 0.001 and c.tol == 0.1
    assert build(c.spec).spec == c.spec
    assert build("  QSGD : levels=4 ").levels == 4
    assert build("dgc:hierarchical=false").hierarchical is False


@pytest.mark.parametrize("spec, fragment", [
    ("nope", "valid names: none"),
    ("", "valid names"),
    ("topk:density=2", "density must be in (0, 1]"),
    ("topk:density=0", "density must be in (0, 1]"),
    ("topk:density=abc", "not a valid float"),
    ("topk:k=5", "unknown parameter 'k' for topk; valid parameters: density"),
    ("topk:density", "not key=value"),
    ("qsgd:levels=1.5", "not a valid int"),
    ("qsgd:levels=0", "levels must be in 1..127"),
    ("strom", "needs parameter 'tau'"),
    ("dgc:hierarchical=maybe", "not a valid bool"),
    ("fp16:x=1", "valid parameters: none"),
    ("topk:density=0.1,density=0.2", "given twice"),
])
def test_config_errors_are_one_clear_line(spec: str, fragment: str) -> None:
    with pytest.raises(CompressionConfigError) as info:
        build(spec)
    msg = str(info.value)
    assert fragment in msg and "\n" not in msg
    assert isinstance(info.value, ValueError)


def test_build_sparsifier_and_validate() -> None:
    assert isinstance(build_sparsifier("ldte-bs:density=0.01"), Sparsifier)
    with pytest.raises(CompressionConfigError, match="not a sparsifier; valid sparsifiers: .*topk"):
        build_sparsifier("qsgd:levels=16")
    validate("mean-threshold")
    validate("ldte-bs:density=0.01", require_sparse=True)
    with pytest.raises(CompressionConfigError):
        validate("fp16", require_sparse=True)
    with pytest.raises(CompressionConfigError):
        validate("bogus")


# ------------------------------------------------------------------------------ pipeline

def test_pipeline_none_is_identity_and_counts_dense_bytes() -> None:
    pipe = GradientPipeline("none")
    g = torch.randn(10, 10)
    pipe.begin_step()
    assert pipe.apply("w", g) is g
    assert pipe.last_payload_bytes == len(encode({"x": g.reshape(-1)}))


def test_pipeline_counts_bytes_per_step() -> None:
    pipe = GradientPipeline("topk:density=0.1")
    g = torch.randn(1000)
    pipe.begin_step()
    out = pipe.apply("a", g)
    pipe.apply("b", g)
    one = payload_bytes(build("topk:density=0.1").compress(g)[0])
    assert pipe.last_payload_bytes == 2 * one
    assert int((out != 0).sum()) == 100
    pipe.begin_step()
    assert pipe.last_payload_bytes == 0


@pytest.mark.parametrize("spec", ["topk:density=0.05", "ldte-bs:density=0.05", "ef-signsgd",
                                  "onebit", "powersgd:rank=1", "qsgd:levels=2", "strom:tau=1.5",
                                  "mean-threshold"])
def test_error_feedback_loses_nothing(spec: str) -> None:
    """sum of what was sent + final residual == sum of the gradients fed in."""
    pipe = GradientPipeline(spec, memory="residual")
    gen = torch.Generator().manual_seed(3)
    total_in = torch.zeros(30, 40, dtype=torch.float64)
    total_sent = torch.zeros(30, 40, dtype=torch.float64)
    for _ in range(12):
        pipe.begin_step()
        g = torch.randn(30, 40, generator=gen)
        total_in += g.double()
        total_sent += pipe.apply("w", g).double()
    residual = pipe.memory.residuals["w"].double()
    # float32 rounding only (QSGD with 2 levels is not contractive: its residual grows large)
    scale = 1.0 + float(residual.abs().max()) + float(total_in.abs().max())
    assert torch.allclose(total_sent + residual, total_in, rtol=0, atol=1e-5 * scale)
    assert residual.abs().sum() > 0  # something really was held back


def test_dgc_memory_momentum_correction_and_masking() -> None:
    pipe = GradientPipeline("topk:density=0.25", memory="dgc", momentum=0.5)
    g = torch.tensor([4.0, 1.0, 0.5, 0.25])
    pipe.begin_step()
    out1 = pipe.apply("w", g)  # u = g, v = g: sends the largest (index 0)
    assert torch.equal(out1, torch.tensor([4.0, 0.0, 0.0, 0.0]))
    pipe.begin_step()
    out2 = pipe.apply("w", g)  # u = 0.5 u + g (u[0] masked to 0 -> 4), v = v + u
    # v before = [0, 1, .5, .25]; u = [4, 1.5, .75, .375]; v = [4, 2.5, 1.25, .625]
    assert torch.equal(out2, torch.tensor([4.0, 0.0, 0.0, 0.0]))
    assert torch.allclose(pipe.memory.v["w"], torch.tensor([0.0, 2.5, 1.25, 0.625]))
    assert torch.allclose(pipe.memory.u["w"], torch.tensor([0.0, 1.5, 0.75, 0.375]))


def test_dgc_memory_needs_a_sparsifier() -> None:
    with pytest.raises(CompressionConfigError, match="needs a sparsifier"):
        GradientPipeline("qsgd", memory="dgc")
    with pytest.raises(CompressionConfigError, match="valid: none, residual, dgc"):
        GradientPipeline("topk", memory="momentum")


@pytest.mark.parametrize("spec, memory", [("ldte-bs:density=0.1", "residual"),
                                          ("topk:density=0.1", "dgc"),
                                          ("powersgd:rank=2", "residual"),
                                          ("qsgd", "residual"),
                                          ("randomk:density=0.2", "none")])
def test_pipeline_state_survives_torch_save(spec: str, memory: str) -> None:
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(20, 30, generator=gen) for _ in range(6)]
    a = GradientPipeline(spec, memory)
    for g in grads[:3]:
        a.begin_step()
        a.apply("w", g)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = GradientPipeline(spec, memory)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert b.step == a.step
    for g in grads[3:]:
        a.begin_step()
        b.begin_step()
        assert torch.equal(a.apply("w", g), b.apply("w", g))


def test_pipeline_delayed_start_and_warmup() -> None:
    pipe = GradientPipeline("topk:density=0.01", delay_steps=2, warmup_steps=4, warmup_start=0.25)
    g = torch.randn(10_000)
    kept = []
    for _ in range(8):
        pipe.begin_step()
        kept.append(int((pipe.apply("w", g) != 0).sum()))
    assert kept[0] == kept[1] == 10_000  # delayed: dense
    assert kept[2] == 2500  # warm-up starts at 25 %
    assert kept[2] > kept[3] > kept[4] > kept[5] > kept[6] == kept[7] == 100
