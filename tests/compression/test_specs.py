"""The torch-free table of compressor names and parameters (what configuration validation
checks, p2pnode/compression/specs.py) against the compressors themselves: same names, same
parameters and defaults, same sparsifiers, and a spec the table accepts always builds while
one it refuses never does."""

from __future__ import annotations

import inspect

import pytest

from p2pnode.compression import CompressionConfigError, Sparsifier, build
from p2pnode.compression.registry import REGISTRY
from p2pnode.compression.specs import REQUIRED, SPECS, validate


def test_table_matches_every_constructor() -> None:
    assert list(SPECS) == list(REGISTRY)
    for name, cls in REGISTRY.items():
        spec = SPECS[name]
        assert spec.sparse == issubclass(cls, Sparsifier), name
        params = {p.name: p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        assert list(params) == list(spec.params), name
        for key, p in params.items():
            want = REQUIRED if p.default is inspect.Parameter.empty else p.default
            assert spec.params[key].default == want or spec.params[key].default is want, (name, key)
            assert spec.params[key].kind is type(want) or want is REQUIRED, (name, key)


CASES = [
    "topk:density=0.1", "topk:density=0", "topk:density=1.5", "topk:density=nan", "topk:density=inf",
    "ldte-bs:tol=1", "ldte-bs:tol=0", "ldte-bs:max_iter=-1", "dgc:sample=0", "dgc:sample=1",
    "rgc:ratio=1", "rgc:ratio=0.3", "randomk:seed=-1", "randomk:seed=4611686018427387904",
    "strom:tau=inf", "strom:tau=0", "strom:tau=0.01", "qsgd:levels=0", "qsgd:levels=127",
    "qsgd:levels=128", "qsgd:bucket=0", "terngrad:clip=-1", "terngrad:clip=inf", "terngrad:clip=0",
    "powersgd:rank=0", "powersgd:rank=4", "fp16", "bogus", "topk:k=3", "topk:density=x",
]


@pytest.mark.parametrize("spec", CASES)
def test_table_and_constructors_agree(spec: str) -> None:
    try:
        build(spec)
        built = None
    except CompressionConfigError as exc:
        built = str(exc)
    try:
        validate(spec)
        checked = None
    except CompressionConfigError as exc:
        checked = str(exc)
        assert "\n" not in checked
    assert (built is None) == (checked is None), (spec, built, checked)


def test_sparse_requirement_without_torch_objects() -> None:
    validate("ldte:density=0.01", require_sparse=True)
    with pytest.raises(CompressionConfigError, match="not a sparsifier; valid sparsifiers: .*topk"):
        validate("qsgd:levels=4", require_sparse=True)
