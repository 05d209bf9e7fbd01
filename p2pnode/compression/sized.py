"""Top-k for the publish path: exact on small tensors, an estimated threshold on big ones.

An exact ``torch.topk`` of 10 % costs 0.2-0.5 s per 4M-value tensor on one thread (7-26 s for
a 124M-parameter model on a loaded 2-core machine), so a big model published rarely and its
exchanges stalled. Above ``exact_below`` values a tensor is therefore selected by LDTE-BS's
threshold search (seed 001), started from a sampled quantile (as DGC does) rather than the
Laplace fit (a publish's residual or an Adam update is far from Laplace-shaped), whose
kept count is always within ``tol`` of k (it falls back to exact top-k among the bracketed
candidates when the search cannot get there): the bytes stay those of the configured ratio.
Small tensors (every tensor of the small CNN, whose figures were tuned with exact top-k) keep
the exact selection, where it is cheap. What is not selected stays in x - x_hat either way: the
publisher's error feedback does not depend on how the entries were chosen.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from p2pnode.compression.base import Sparsifier, flatnonzero, kept_count
from p2pnode.compression.ldte import LDTEBS
from p2pnode.compression.topk import TopK

__all__ = ["ESTIMATE_TOL", "EXACT_BELOW", "SizedTopK", "publish_selector"]

#: tensors of fewer values than this keep exact top-k (the small CNN's largest has 0.4M)
EXACT_BELOW = 1 << 20
#: a big tensor's kept count is within this fraction of k (LDTE-BS's tolerance)
ESTIMATE_TOL = 0.05
#: the first probe's sample: one value in this many, and at least SAMPLE_MIN values
SAMPLE_SHARE = 100
SAMPLE_MIN = 1 << 17


class SizedTopK:
    """``select`` as ``TopK(density)`` below ``exact_below`` values, by LDTE-BS at or above.

    ``stats`` after each call: ``exact`` (True if torch.topk chose), ``k`` and ``count``."""

    def __init__(self, density: float, exact_below: int = EXACT_BELOW, tol: float = ESTIMATE_TOL) -> None:
        self.density = density
        self.exact_below = int(exact_below)
        self.tol = tol
        self.exact = TopK(density)
        self.estimated = LDTEBS(density, tol=tol)
        self.stats: dict[str, Any] = {}
        self._gen = torch.Generator().manual_seed(0)  # the sample's: runs are repeatable

    def sampled_threshold(self, flat: torch.Tensor, k: int) -> float:
        """The magnitude that k of n values reach, read from a uniform sample (as DGC does):
        of 1 % of the values, and at least 2^17 of them, so that at 10 % kept the count it
        gives is off by about 1 % of k (binomial), and at 1 % by about 3 %, whatever the
        shape of the values."""
        n = flat.numel()
        m = min(n, max(n // SAMPLE_SHARE, SAMPLE_MIN))
        # index_select: 0.6 ms for 2^17 random reads here, indexing with [] 14-18 ms
        sample = flat.index_select(0, torch.randint(0, n, (m,), generator=self._gen)).abs_()
        above = max(1, min(m, round(m * k / n)))
        return float(torch.kthvalue(sample, m - above + 1).values)

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        """Indices (int64) of the entries to keep: k exactly below the size, k within ``tol``
        at or above it (ascending there, as ``flatnonzero`` gives them, unless exact top-k had
        to finish the search). The search's first probe is a sampled quantile: one counting
        pass, mostly, where from the Laplace key point a residual or an Adam update took many."""
        n = flat.numel()
        k = kept_count(n, self.density) if n else 0
        if n < self.exact_below or k >= n:
            idx = self.exact.select(flat)
            self.stats = {"exact": True, "k": k, "count": int(idx.numel())}
            return idx
        start = self.sampled_threshold(flat, k)
        # the sample's quantile is 0 where most values did not move (rows of an embedding no
        # batch touched): if all that moved fits in k, exact top-k would add only zeros to it
        if start == 0.0 and int(np.count_nonzero(flat.detach().numpy())) <= k:
            idx = flatnonzero(flat != 0)
        else:
            idx = self.estimated.select_k(flat, k, start)
        self.stats = {"exact": False, "k": k, "count": int(idx.numel())}
        return idx


def publish_selector(sparsifier: Sparsifier) -> Sparsifier | SizedTopK:
    """What the publisher selects with: exact ``topk`` (the default) becomes :class:`SizedTopK`
    of the same density; any other sparsifier is used as configured."""
    if type(sparsifier) is TopK:
        return SizedTopK(sparsifier.density)
    return sparsifier
