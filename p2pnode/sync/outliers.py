"""One node's contribution far from all the others' (``exchange.sync_outlier``): taken as their
coordinate-wise median instead. Torch-free (numpy): the reducer runs in the daemon.

Why: the reducer gives every contribution the same weight, so one node whose gradient is off by
orders of magnitude (a bug in its task, data of another scale, a broken machine, or a member
that sends its gradient negated and scaled up) carries every node's step with it; DDP shares
the flaw. The centre is the coordinate-wise median of the phase's contributions, which fewer
than half of them cannot move far. A contribution further from it than ``sync_outlier`` times
the median of their distances from it (at least ``FLOOR`` of the centre's norm) is replaced by
the centre, not pulled in to the bound (centred clipping kept too much of the attack). The
default leaves honest phases alone, even a node whose classes are its own, and a phase with no
outlier is averaged exactly as without the check. It guards against gross faults, not against a
member that keeps inside the threshold (the mode trusts its members, behind the cluster secret).
With fewer than ``MIN_PARTS`` contributions there is no majority to measure against, and nothing
is changed. docs/ALGORITHMS.md, "Synchronous PowerSGD", has the measurements.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np

log = logging.getLogger("p2pnode.sync")

#: contributions a phase needs before any is taken for an outlier (two: no majority to say which)
MIN_PARTS = 3
#: the distance under which no part is an outlier, as a share of the centre's norm: the models'
#: mean after training is of models nearly alike (most of them equal to the bit, so the median
#: distance is 0), and a node that missed a round or two is not one to replace
FLOOR = 0.01
#: seconds between two warnings about one node's outlying contributions
WARN_EVERY = 60.0


def median(parts: list[np.ndarray]) -> np.ndarray:
    """The coordinate-wise median of ``parts``. Three or four, the common cases, by element-wise
    minima and maxima (a selection, exact whatever the magnitudes: a sum less the extremes is
    not, once one part is 1e20), into as few new arrays as can be (each is as long as the
    phase: the reducer's time here went to allocating them); more, by sorting."""
    n = len(parts)
    if n == 3:
        a, b, c = parts
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        return np.maximum(lo, np.minimum(hi, c, out=hi), out=lo)
    if n == 4:  # the middle two: the larger of the pairs' minima and the smaller of their maxima
        a, b, c, d = parts
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        np.maximum(lo, np.minimum(c, d), out=lo)
        np.minimum(hi, np.maximum(c, d), out=hi)
        lo += hi
        lo /= 2
        return lo
    ordered = np.sort(np.stack(parts), axis=0)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """The dot product of two vectors in numpy's own loop, not BLAS's (``a @ b``): OpenBLAS
    hands a vector this long to its thread pool, whose threads spin for cores that the workers
    keep busy. The reducer makes three a contribution, on the event loop. In daemons run as a
    service (no ``OMP_NUM_THREADS=1``, which the benchmarks and the demo set), one ``@`` took
    about 8 ms on a loaded 2-core machine against 0.07 ms here, and 4 nodes' synchronous runs
    took 1.3 times as long (docs/BENCHMARKS.md, "The reducer's dot products and BLAS's threads")."""
    return float(np.einsum("i,i->", a, b))


def replace_outliers(parts: list[np.ndarray], threshold: float) -> tuple[list[np.ndarray], dict[int, float], float]:
    """(``parts`` with each outlier replaced by the centre; the outliers' indices, each with its
    distance from the centre in units of the scale; the largest such distance of the phase, 0
    when not measured). The scale is the median distance, or ``FLOOR`` times the centre's norm
    if that is more. ``threshold`` 0: off."""
    if threshold <= 0 or len(parts) < MIN_PARTS:
        return parts, {}, 0.0
    parts64 = [np.asarray(p, dtype=np.float64) for p in parts]
    centre = median(parts64)
    cc = dot(centre, centre)
    # |p - c|^2 from dot products: no array as long as the phase for each part (0 at least: rounding)
    dist = np.sqrt(np.maximum(0.0, [dot(p, p) - 2 * dot(p, centre) + cc for p in parts64]))
    scale = max(float(np.median(dist)), FLOOR * float(np.sqrt(cc)))
    if scale <= 0:  # every part the same
        return parts, {}, 0.0
    ratio = dist / scale
    over = {i: float(r) for i, r in enumerate(ratio) if r > threshold}
    if not over:
        return parts, {}, float(ratio.max())
    return [centre if i in over else part for i, part in enumerate(parts)], over, float(ratio.max())


#: elements per slice when a phase is averaged slice by slice (``mean_in_chunks``)
CHUNK = 1 << 20


def mean_in_chunks(parts: list[np.ndarray], threshold: float,
                   out_dtype: type[np.floating] = np.float64) -> tuple[np.ndarray, dict[int, float], float]:
    """(the mean of ``parts`` with each outlier taken as the centre; the outliers, as
    :func:`replace_outliers` gives them; the largest distance) computed a slice of ``CHUNK``
    elements at a time: the float64 copies, the centre and the sum exist for one slice only, so
    a phase as long as a whole model (the models' mean after training, 124M float32 values from
    each node) costs the parts, the mean and a few slices, not the parts again in float64 (18x
    the model was measured before, docs/BENCHMARKS.md). Each element's sum is taken in float64
    in the parts' order, as before; only the distances' dot products are summed in another order."""
    n = len(parts)
    size = parts[0].size
    check = threshold > 0 and n >= MIN_PARTS
    over: dict[int, float] = {}
    largest = 0.0
    if check:
        pp, pc, cc = np.zeros(n), np.zeros(n), 0.0
        for at in range(0, size, CHUNK):
            sl = [np.asarray(p[at:at + CHUNK], dtype=np.float64) for p in parts]
            centre = median(sl)
            cc += dot(centre, centre)
            for i, p in enumerate(sl):
                pp[i] += dot(p, p)
                pc[i] += dot(p, centre)
        dist = np.sqrt(np.maximum(0.0, pp - 2 * pc + cc))
        scale = max(float(np.median(dist)), FLOOR * float(np.sqrt(cc)))
        if scale > 0:
            ratio = dist / scale
            over = {i: float(r) for i, r in enumerate(ratio) if r > threshold}
            largest = float(ratio.max())
    mean = np.empty(size, dtype=out_dtype)
    for at in range(0, size, CHUNK):
        sl = [np.asarray(p[at:at + CHUNK], dtype=np.float64) for p in parts]
        if over:
            centre = median(sl)
            sl = [centre if i in over else part for i, part in enumerate(sl)]
        total = np.zeros(sl[0].shape, dtype=np.float64)
        for part in sl:
            total += part
        mean[at:at + CHUNK] = total / n
    return mean, over, largest


class OutlierCheck:
    """The reducer's check of every phase it closes: what it replaced, by node, and the largest
    distance it measured (status: ``sync.outliers``, ``outlier_nodes``, ``largest_distance``);
    a node's outliers are said in the log once a while."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold  #: exchange.sync_outlier (0: off)
        self.by_node: Counter[str] = Counter()
        #: the largest distance of a contribution from its phase's median, in median distances
        self.largest = 0.0
        self._warned: dict[str, float] = {}  #: node -> monotonic time of its last warning

    def apply(self, names: list[str], parts: list[np.ndarray], rnd: int, phase: int) -> list[np.ndarray]:
        """``parts`` (from the nodes ``names``, for round ``rnd``'s ``phase``), each outlier replaced."""
        out, over, largest = replace_outliers(parts, self.threshold)
        self.note(names, over, largest, rnd, phase)
        return out

    def mean(self, names: list[str], parts: list[np.ndarray], rnd: int, phase: int,
             out_dtype: type[np.floating] = np.float64) -> np.ndarray:
        """The mean of ``parts``, outliers taken as the centre, slice by slice (``mean_in_chunks``)."""
        mean, over, largest = mean_in_chunks(parts, self.threshold, out_dtype)
        self.note(names, over, largest, rnd, phase)
        return mean

    def note(self, names: list[str], over: dict[int, float], largest: float, rnd: int, phase: int) -> None:
        """Count and say (once a while per node) the outliers of one phase."""
        self.largest = max(self.largest, largest)
        for i, ratio in over.items():
            node = names[i]
            self.by_node[node] += 1
            if (now := time.monotonic()) - self._warned.get(node, -WARN_EVERY) >= WARN_EVERY:
                self._warned[node] = now
                log.warning("node %s's contribution to round %d (phase %d) lay %.1f times the others' distance "
                            "from their median (exchange.sync_outlier = %g): taken as the median (%d so far)",
                            node, rnd, phase, ratio, self.threshold, self.by_node[node])
