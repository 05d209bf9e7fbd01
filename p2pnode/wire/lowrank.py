"""Low-rank delta entries: a matrix's change sent as rank-r factors (``compression.publish_rank``).

The change of a weight matrix between two publishes (x − x̂, rows × cols, a conv kernel viewed as
out × in·kh·kw) is close to low rank, and its best rank-r approximation carries far more of it
per byte than top-k's largest entries: in the lockstep study (docs/BENCHMARKS.md, "The in-process
study, eighth round") rank-24 factors of the small CNN's matrices every 4 steps beat 10 % top-k at
the same bytes, and rank 8 matched it at a third of them (PowerSGD, Vogels et al. 2019, applied to
the CHOCO residual instead of the gradient).

A factor entry is r components, each an int8 column ``a_j`` (rows), an int8 row ``b_j`` (cols)
and one exponent ``e_j``; the change is

    Δ = Σ_j 2^e_j · outer(a_j, b_j)

computed by :meth:`Factors.product` in float64 from integers (each term is exact: |a·b| ≤ 127²,
times a power of two), summed in a fixed order, then rounded once to float32. No BLAS, no
summation order left to a library: every machine computes the same float32 bits, so the
publisher's x̂ and every replica stay bit-equal, as with sparse entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

#: most components one entry may carry (bounds a receiver's work: r multiply-adds an element)
MAX_RANK = 64
#: range of a component's exponent (int8 levels times 2**e stays far inside float32's range)
EXPONENTS = (-200, 80)
LEVELS = 127
ENTRY_KEYS = frozenset({"t", "r", "a", "b", "e"})


class FactorError(ValueError):
    """A factor entry that must not be applied."""


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, cols) a tensor is factored as (first dimension × the rest), or None for a vector."""
    if len(shape) < 2 or not shape[0]:
        return None
    rows = shape[0]
    return rows, math.prod(shape) // rows


def worth_factoring(shape: tuple[int, ...], rank: int) -> bool:
    """Whether rank-``rank`` factors of this tensor cost at most half its entries (else the
    sparsifier sends it: a vector, or a matrix too narrow for the rank)."""
    m = matrix_shape(shape)
    return m is not None and 0 < rank <= min(m) and rank * (m[0] + m[1]) * 2 <= m[0] * m[1]


@dataclass(frozen=True)
class Factors:
    """Δ = Σ_j 2^e[j] · outer(a[j], b[j]); a int8 (r, rows), b int8 (r, cols), e int64 (r,)."""

    a: np.ndarray
    b: np.ndarray
    e: np.ndarray

    @property
    def rank(self) -> int:
        return int(self.e.size)

    def product(self) -> np.ndarray:
        """Δ as a flat float32 array, the same bits on every machine (module docstring)."""
        out = np.zeros((self.a.shape[1], self.b.shape[1]), np.float64)
        for j in range(self.rank):
            out += np.ldexp(np.multiply.outer(self.a[j].astype(np.float64), self.b[j].astype(np.float64)),
                            int(self.e[j]))
        return out.astype(np.float32).reshape(-1)


def _int8_scale(v: np.ndarray) -> int | None:
    """The least exponent x with max|v| / 2**x <= 127, or None for an all-zero vector."""
    maxabs = float(np.abs(v).max())
    if maxabs == 0.0 or not math.isfinite(maxabs):
        return None
    x = math.frexp(maxabs / LEVELS)[1]
    while math.ldexp(maxabs, -(x - 1)) <= LEVELS:
        x -= 1
    while math.ldexp(maxabs, -x) > LEVELS:
        x += 1
    return x


#: matrices with both sides above this get a randomized SVD (Halko et al. 2011: a range of rank
#: + 8 found by two power iterations), not the exact one: a 512 x 4608 kernel's exact SVD takes
#: a third of a second, and a large model has dozens of them a publish
EXACT_SVD_MAX = 256


def _svd(d: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if min(d.shape) <= EXACT_SVD_MAX:
        return np.linalg.svd(d, full_matrices=False)
    k = min(rank + 8, *d.shape)
    y = d @ np.random.default_rng(0).standard_normal((d.shape[1], k))
    for _ in range(2):
        q = np.linalg.qr(y)[0]
        y = d @ (d.T @ q)
    q = np.linalg.qr(y)[0]
    u, s, vh = np.linalg.svd(q.T @ d, full_matrices=False)
    return q @ u, s, vh


def factorize(diff: np.ndarray, shape: tuple[int, ...], rank: int) -> Factors | None:
    """The best rank-``rank`` approximation of ``diff`` (flat, float32) viewed as a matrix,
    rounded to int8 factors; None if nothing is left (a zero change). The singular values are
    split evenly between the two sides (√s each) and every column and row gets its own scale, so
    a small component keeps its precision beside a large one."""
    rows, cols = matrix_shape(shape) or (0, 0)
    d = np.asarray(diff, np.float64).reshape(rows, cols)
    u, s, vh = _svd(d, rank)
    a_rows, b_rows, exps = [], [], []
    for j in range(min(rank, s.size)):
        if s[j] <= 0 or not math.isfinite(s[j]):
            break
        root = math.sqrt(s[j])
        a, b = u[:, j] * root, vh[j] * root
        ea, eb = _int8_scale(a), _int8_scale(b)
        if ea is None or eb is None or not EXPONENTS[0] <= ea + eb <= EXPONENTS[1]:
            continue
        ka = np.rint(np.ldexp(a, -ea)).astype(np.int8)
        kb = np.rint(np.ldexp(b, -eb)).astype(np.int8)
        if not ka.any() or not kb.any():
            continue
        a_rows.append(ka)
        b_rows.append(kb)
        exps.append(ea + eb)
    if not exps:
        return None
    return Factors(np.stack(a_rows), np.stack(b_rows), np.asarray(exps, np.int64))


def encode_entry(name: str, t: int, f: Factors, shape: tuple[int, ...]) -> dict[str, Any]:
    """The wire entry of one tensor's factors; ValueError if they do not fit its shape."""
    m = matrix_shape(shape)
    r = f.rank
    if m is None or not 0 < r <= min(MAX_RANK, *m) or f.a.shape != (r, m[0]) or f.b.shape != (r, m[1]):
        raise ValueError(f"{name}: factors do not fit shape {shape}")
    if f.a.dtype != np.int8 or f.b.dtype != np.int8:
        raise ValueError(f"{name}: factors must be int8")
    if r * (m[0] + m[1]) > m[0] * m[1]:
        raise ValueError(f"{name}: rank {r} factors are larger than the tensor")
    exps = [int(x) for x in f.e]
    if any(not EXPONENTS[0] <= x <= EXPONENTS[1] for x in exps):
        raise ValueError(f"{name}: factor exponent out of range")
    return {"t": t, "r": r, "a": f.a.tobytes(), "b": f.b.tobytes(), "e": exps}


def decode_entry(name: str, e: Mapping[str, Any], shape: tuple[int, ...]) -> Factors:
    """Check and decode a factor entry (keys :data:`ENTRY_KEYS`); FactorError on anything wrong."""
    m = matrix_shape(shape)
    if m is None:
        raise FactorError(f"{name}: factors for a tensor that is not a matrix")
    r = e["r"]
    if type(r) is not int or not 0 < r <= min(MAX_RANK, *m) or r * (m[0] + m[1]) > m[0] * m[1]:
        raise FactorError(f"{name}: bad factor rank")
    a, b, exps = e["a"], e["b"], e["e"]
    if not isinstance(a, bytes) or len(a) != r * m[0] or not isinstance(b, bytes) or len(b) != r * m[1]:
        raise FactorError(f"{name}: factor bytes do not match the rank and shape")
    if not isinstance(exps, list) or len(exps) != r or any(
            type(x) is not int or not EXPONENTS[0] <= x <= EXPONENTS[1] for x in exps):
        raise FactorError(f"{name}: bad factor exponents")
    return Factors(np.frombuffer(a, np.int8).reshape(r, m[0]), np.frombuffer(b, np.int8).reshape(r, m[1]),
                   np.asarray(exps, np.int64))
