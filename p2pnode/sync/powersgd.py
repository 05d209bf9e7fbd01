"""The worker's side of synchronous PowerSGD: a step's gradient as two phases of factors,
and the network's mean gradient rebuilt from the two means.

Vogels, Karimireddy, Jaggi 2019 (*PowerSGD*), as PyTorch's DDP comm hook runs it: each weight
matrix M (its gradient plus this node's error feedback, what earlier approximations left out)
gives P = M Q; the nodes' P are averaged (phase 0), orthonormalised, and give Q' = Mᵀ P, averaged
too (phase 1); every node then steps along P Q'ᵀ, the same rank-r approximation of the mean
gradient, and keeps M − P Q'ᵀ as its error. Q' warm-starts the next step. Vectors (biases) and
matrices that factoring would not halve travel whole in phase 0 (the hook's
``min_compression_rate``, 2: the small CNN's classifier, 10 x 128, goes whole rather than at rank
6 of 10; measured in docs/BENCHMARKS.md, twelfth round). Every value crosses as float16.

Every node must hold the same Q: they start from ``training.seed`` and each phase 1's mean
replaces them; a node whose Q fell behind (it missed a round) is sent the current ones
(``resync``) and takes a local step meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


#: a matrix is factored only when that divides its size by at least this (PyTorch's hook's default)
MIN_COMPRESSION_RATE = 2.0
#: the largest float16: larger values are clipped to it rather than sent as infinities
F16_MAX = 65504.0


@dataclass
class _Layout:
    name: str
    shape: tuple[int, ...]
    rows: int
    cols: int
    rank: int  #: 0: sent whole


def to_wire(tensors: list[torch.Tensor], dtype: str = "<f2") -> bytes:
    if not tensors:
        return b""
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    if dtype == "<f2":
        flat = flat.clamp(-F16_MAX, F16_MAX)
    return flat.numpy().astype(dtype).tobytes()


def from_wire(data: bytes, size: int, dtype: str = "<f2") -> torch.Tensor:
    arr = np.frombuffer(data, dtype=dtype)
    if arr.size != size:
        raise ValueError(f"a mean of {arr.size} values where {size} were expected")
    if not np.isfinite(arr).all():
        raise ValueError("a mean with non-finite values")
    return torch.from_numpy(arr.astype(np.float32))


class PowerSync:
    def __init__(self, named: list[tuple[str, torch.Tensor]], rank: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.layout: list[_Layout] = []
        self.q: dict[str, torch.Tensor] = {}
        self.err: dict[str, torch.Tensor] = {}
        for name, p in named:
            rows = p.shape[0] if p.dim() else 1
            cols = p[0].numel() if p.dim() > 1 else 1
            r = min(rank, rows, cols)
            if p.dim() < 2 or (rows + cols) * r * MIN_COMPRESSION_RATE >= rows * cols:
                r = 0
            self.layout.append(_Layout(name, tuple(p.shape), rows, cols, r))
            if r:
                self.q[name] = torch.randn(cols, r, generator=gen)
                self.err[name] = torch.zeros(rows, cols)
        #: the round whose phase 1 gave our Q (-1: the seeded ones)
        self.q_round = -1
        self._m: dict[str, torch.Tensor] = {}
        self._g: dict[str, torch.Tensor] = {}  #: this step's gradients, without the error
        self._p: dict[str, torch.Tensor] = {}
        self._dense: dict[str, torch.Tensor] = {}

    def _size(self, phase: int) -> int:
        if phase == 0:
            return sum(x.rows * x.rank if x.rank else x.rows * x.cols for x in self.layout)
        return sum(x.cols * x.rank for x in self.layout if x.rank)

    def phase0(self, grads: dict[str, torch.Tensor]) -> bytes:
        """Our P factors (and the small tensors whole) for this step's gradients."""
        out = []
        self._m, self._g = {}, {}
        for x in self.layout:
            g = grads[x.name].detach().float().reshape(x.rows, x.cols)
            if x.rank:
                m = g + self.err[x.name]
                self._m[x.name], self._g[x.name] = m, g
                out.append(m @ self.q[x.name])
            else:
                out.append(g)
        return to_wire(out)

    def _split0(self, mean0: bytes) -> None:
        """The network's mean P, orthonormalised, and the small tensors' mean, from phase 0."""
        flat = from_wire(mean0, self._size(0))
        at = 0
        self._p, self._dense = {}, {}
        for x in self.layout:
            n = x.rows * (x.rank or x.cols)
            part = flat[at:at + n]
            at += n
            if x.rank:
                self._p[x.name], _ = torch.linalg.qr(part.reshape(x.rows, x.rank))
            else:
                self._dense[x.name] = part.reshape(x.shape)

    def phase1(self, mean0: bytes, clean: bool = False) -> bytes:
        """Our Q factors against the network's mean P (orthonormalised). ``clean``: the round's
        nodes are not the round before's, and our error feedback is left out (this step's
        gradient alone; the error starts again from what the round leaves of it).

        Why: a node's error is M - P Q'^T with P Q'^T the approximation of the *mean* M, so it
        holds, besides the compression's residual, the node's own deviation from the mean,
        summed over every round (a random walk on even shards; growing with every step on
        skewed ones, where a node's gradient always leans towards its classes). The deviations
        cancel in the mean only while the same nodes are in every round. One node out (late,
        restarted, dropped) and the others' sum of deviations, minus the missing one's, entered
        the mean whole; one node back and its own did (tests/sync/test_powersgd_sync.py: after
        40 rounds of nodes leaning their own ways, one node out put a round's mean 8 times the
        gradient's norm off it; with the errors left out, 0.9). P, averaged in phase 0 before
        the round's nodes are known, still holds the deviations: its subspace is off for a
        round, but the mean taken in it is of the gradients."""
        self._split0(mean0)
        if clean:
            self._m = dict(self._g)
        out = [self._m[x.name].t() @ self._p[x.name] for x in self.layout if x.rank]
        # a model with no matrix to factor still takes part in phase 1 (one zero, averaged away)
        return to_wire(out) if out else b"\0\0"

    def _approx(self, mean1: bytes, rnd: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the network's mean gradient, rank-r, for every tensor; the matrices' approximations),
        from phase 1's mean Q; our Q and round move on to it."""
        flat = from_wire(mean1, self._size(1)) if self._size(1) else torch.zeros(0)
        grads, approx, at = dict(self._dense), {}, 0
        for x in self.layout:
            if not x.rank:
                continue
            n = x.cols * x.rank
            q = flat[at:at + n].reshape(x.cols, x.rank)
            at += n
            approx[x.name] = self._p[x.name] @ q.t()
            self.q[x.name] = q.clone()
            grads[x.name] = approx[x.name].reshape(x.shape)
        self.q_round = rnd
        return grads, approx

    def finish(self, mean1: bytes, rnd: int, included: bool) -> dict[str, torch.Tensor]:
        """The network's mean gradient, rank-r, for every tensor; our Q moves on, and our error
        feedback too when the mean carried our share (``included``). Left out of phase 1 (a
        slow node, not waited for there), this step's gradient is dropped, not owed: owing it
        piled up a slow node's late gradients in its error until one contribution carried them
        all, and that pile steered every node's P factors (measured: 0.8 pt lost on average
        with a straggler, docs/BENCHMARKS.md)."""
        grads, approx = self._approx(mean1, rnd)
        if included:
            for name, a in approx.items():
                self.err[name] = self._m[name] - a
        return grads

    def rebuild(self, mean0: bytes, mean1: bytes, rnd: int) -> dict[str, torch.Tensor]:
        """A round we missed, from its two means: the mean gradient every node in it stepped
        along (the same operations as theirs, so the same to the bit). Our error feedback is
        left as it was: the gradient we computed meanwhile is dropped, not owed (a straggler
        owing every step it missed would bring a growing pile of stale gradients)."""
        self._split0(mean0)
        return self._approx(mean1, rnd)[0]

    def resync(self, mean1: bytes, rnd: int) -> None:
        """The current Q from the reducer (ours were older): the next step uses these."""
        flat = from_wire(mean1, self._size(1))
        at = 0
        for x in self.layout:
            if x.rank:
                n = x.cols * x.rank
                self.q[x.name] = flat[at:at + n].reshape(x.cols, x.rank).clone()
                at += n
        self.q_round = rnd
