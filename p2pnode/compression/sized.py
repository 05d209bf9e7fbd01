"""Top-k for the publish path: exact on small tensors, an estimated threshold on big ones.

An exact ``torch.topk`` of 10 % costs 0.4-0.5 s per 4M-value tensor on one thread (14-26 s for
a 124M-parameter model on a loaded 2-core machine), so a big model published rarely and its
exchanges stalled. Above ``exact_below`` values a tensor is therefore selected by LDTE-BS
(seed 001: a Laplace-fit threshold corrected by search, 10-25x faster at these sizes), whose
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
        #: each tensor's last threshold over its mean magnitude (by ``key``): the next first probe
        self._last: dict[str, float] = {}

    def select(self, flat: torch.Tensor, key: str = "") -> torch.Tensor:
        """Indices (int64) of the entries to keep: k exactly below the size, k within ``tol``
        at or above it (ascending there, as ``flatnonzero`` gives them, unless exact top-k had
        to finish the search). ``key`` names the tensor: its threshold found last time is the
        first one tried (one counting pass where the Laplace fit of a residual needs several)."""
        n = flat.numel()
        k = kept_count(n, self.density) if n else 0
        if n < self.exact_below or k >= n:
            idx = self.exact.select(flat)
            self.stats = {"exact": True, "k": k, "count": int(idx.numel())}
            return idx
        moved = int(np.count_nonzero(flat.detach().numpy()))
        if moved <= k:  # everything that moved fits: exact top-k would add only zeros to it
            idx = flatnonzero(flat != 0)
        else:
            idx = self.estimated.select_k(flat, k, self._last.get(key) if key else None)
            ratio = self.estimated.stats.get("ratio")
            if key and ratio is not None:
                self._last[key] = ratio
        self.stats = {"exact": False, "k": k, "count": int(idx.numel())}
        return idx


def publish_selector(sparsifier: Sparsifier) -> Sparsifier | SizedTopK:
    """What the publisher selects with: exact ``topk`` (the default) becomes :class:`SizedTopK`
    of the same density; any other sparsifier is used as configured."""
    if type(sparsifier) is TopK:
        return SizedTopK(sparsifier.density)
    return sparsifier
