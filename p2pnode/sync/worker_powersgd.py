"""The worker's side of synchronous PowerSGD: a step's gradient as two phases of factors,
and the network's mean gradient rebuilt from the two means.

Vogels, Karimireddy, Jaggi 2019 (*PowerSGD*), as PyTorch's DDP comm hook runs it: each weight
matrix M (its gradient plus this node's error feedback, what earlier approximations left out)
gives P = M Q; the nodes' P are averaged (phase 0), orthonormalised, and give Q' = Mᵀ P, averaged
too (phase 1); every node then steps along P Q'ᵀ, the same rank-r approximation of the mean
gradient, and keeps M − P Q'ᵀ as its error (with int8 or int4 values, its own residual: ``finish``).
Q' warm-starts the next step. Vectors (biases) and
matrices that factoring would not halve travel whole in phase 0 (the hook's
``min_compression_rate``, 2: the small CNN's classifier, 10 x 128, goes whole rather than at rank
6 of 10: it ended nearer DDP, docs/ALGORITHMS.md). Every value crosses as int4 in blocks
(the default, at rank 24), int8 in blocks or float16 (``exchange.sync_values``,
``sync/values.py``); each factor column by column, each column (and small tensor) its own
blocks, so that a block's values are of one magnitude.

Every node must hold the same Q: they start from ``training.seed`` and each phase 1's mean
replaces them; a node whose Q fell behind (it missed a round) is sent the current ones
(``resync``) and takes a local step meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from p2pnode.sync.values import BLOCK, LEVELS, BadValues, decode, encode


#: a matrix is factored only when that divides its size by at least this (PyTorch's hook's default)
MIN_COMPRESSION_RATE = 2.0


@dataclass
class _Layout:
    name: str
    shape: tuple[int, ...]
    rows: int
    cols: int
    rank: int  #: 0: sent whole


def to_wire(tensors: list[torch.Tensor], kind: str = "float16") -> bytes:
    if not tensors:
        return b""
    return encode(torch.cat([t.detach().reshape(-1).float() for t in tensors]).numpy(), kind)


def from_wire(data: bytes, size: int, kind: str = "float16") -> torch.Tensor:
    """ValueError unless ``size`` finite values of ``kind``."""
    try:
        return torch.from_numpy(decode(data, kind, size)).float()
    except BadValues as exc:
        raise ValueError(f"a mean refused: {exc}") from None


class PowerSync:
    def __init__(self, named: list[tuple[str, torch.Tensor]], rank: int, seed: int, values: str = "float16") -> None:
        #: the values on the wire (exchange.sync_values)
        self.values = values
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
            if r or self.blocked:  # int8 / int4: the small tensors' rounding is owed too
                self.err[name] = torch.zeros(rows, cols)
        self._factored = [x for x in self.layout if x.rank]  #: the matrices with factors (phase 1's pieces)
        #: the round whose phase 1 gave our Q (-1: the seeded ones)
        self.q_round = -1
        self._m: dict[str, torch.Tensor] = {}
        self._g: dict[str, torch.Tensor] = {}  #: this step's gradients, without the error
        self._p: dict[str, torch.Tensor] = {}
        self._dense: dict[str, torch.Tensor] = {}
        #: int8 / int4: what the wire carried of our parts (phase 1's Q', the small tensors whole), for our error
        self._sent: dict[str, torch.Tensor] = {}

    @property
    def blocked(self) -> bool:
        """Values in blocks with a scale each (int8, int4): their rounding is owed, and our error
        is our own residual (``finish``)."""
        return self.values in LEVELS

    def _shapes(self, phase: int) -> list[tuple[int, int]]:
        """The pieces of a phase, (rows, length of a row) each: phase 0 a matrix's P column by
        column (or a small tensor whole, one row), phase 1 its Q' column by column."""
        if phase == 0:
            return [(x.rank, x.rows) if x.rank else (1, x.rows * x.cols) for x in self.layout]
        return [(x.rank, x.cols) for x in self._factored]

    def _pad(self, n: int) -> int:
        """int8, int4: every row of a piece starts a block of its own, so no block (one scale) mixes
        two columns or two tensors, whose magnitudes may be orders apart."""
        return -n % BLOCK if self.blocked else 0

    def _pack(self, pieces: list[torch.Tensor]) -> bytes:
        return to_wire([F.pad(t, (0, self._pad(t.shape[1]))) for t in pieces], self.values)

    def _unpack(self, data: bytes, phase: int) -> list[torch.Tensor]:
        shapes = self._shapes(phase)
        if not shapes:  # phase 1 of a model with no matrix to factor: its one zero carries nothing
            return []
        flat = from_wire(data, sum(k * (n + self._pad(n)) for k, n in shapes), self.values)
        out, at = [], 0
        for k, n in shapes:
            width = n + self._pad(n)
            out.append(flat[at:at + k * width].reshape(k, width)[:, :n])
            at += k * width
        return out

    def phase0(self, grads: dict[str, torch.Tensor]) -> bytes:
        """Our P factors (and the small tensors whole) for this step's gradients."""
        out = []
        self._m, self._g = {}, {}
        for x in self.layout:
            got = grads.get(x.name)  # None: a parameter this step did not use (a branch not taken)
            g = torch.zeros(x.rows, x.cols) if got is None else got.detach().float().reshape(x.rows, x.cols)
            m = g + self.err[x.name] if x.name in self.err else g
            self._m[x.name], self._g[x.name] = m, g
            out.append((m @ self.q[x.name]).t() if x.rank else m.reshape(1, -1))  # a factor column by column
        data = self._pack(out)
        if self.blocked:
            self._sent = {x.name: piece.reshape(x.rows, x.cols)
                          for x, piece in zip(self.layout, self._unpack(data, 0)) if not x.rank}
        return data

    def _split0(self, mean0: bytes) -> None:
        """The network's mean P, orthonormalised, and the small tensors' mean, from phase 0."""
        self._p, self._dense = {}, {}
        for x, piece in zip(self.layout, self._unpack(mean0, 0)):
            if x.rank:
                self._p[x.name], _ = torch.linalg.qr(piece.t())
            else:
                self._dense[x.name] = piece.reshape(x.shape)

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
            self._m.update({x.name: self._g[x.name] for x in self._factored})
        out = [(self._m[x.name].t() @ self._p[x.name]).t() for x in self._factored]  # column by column
        if not out:  # a model with no matrix to factor still takes part in phase 1 (one zero, averaged away)
            return to_wire([torch.zeros(1)], self.values)
        data = self._pack(out)
        if self.blocked:
            self._sent.update({x.name: piece.t() for x, piece in zip(self._factored, self._unpack(data, 1))})
        return data

    def _approx(self, mean1: bytes, rnd: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the network's mean gradient, rank-r, for every tensor; the matrices' approximations),
        from phase 1's mean Q; our Q and round move on to it."""
        grads, approx = dict(self._dense), {}
        for x, piece in zip(self._factored, self._unpack(mean1, 1)):
            q = piece.t()
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
        with a straggler, docs/ALGORITHMS.md).

        With int8 or int4 values our error is our M less *our own* projection on the shared P as our
        phase 1 part crossed the wire (P Q'_oursᵀ, Q'_ours = Mᵀ P rounded), not less the mean's
        approximation P Q'ᵀ (PowerSGD's). Averaged over the nodes the two are the same but for
        the reducer's rounding of the mean, so every later mean is too; the rounding of our
        part is owed, not lost (as the small tensors' is: their error is what rounding left
        out). But M − P Q'ᵀ also keeps our lean from the mean within P, summed over every step:
        on skewed shards a node's parts grew to about a thousand times the mean they sum to
        (docs/ALGORITHMS.md, "Synchronous PowerSGD"), more than int8's two digits
        can carry; our own projection drops that lean at every step. With float16 it was
        measured and not kept (no gain on the daemons)."""
        grads, approx = self._approx(mean1, rnd)
        if included:
            # M becomes the error in place (M = gradient + error, a tensor of ours alone; after a
            # clean phase 1 it is the gradient itself, which the mean overwrites: copied first):
            # one copy of each matrix less at the step's peak, 0.44 GB at the GPT-2 example's size
            for x in self.layout:
                if x.name not in self.err:
                    continue
                m = self._m[x.name]
                if m is self._g[x.name]:
                    m = m.clone()
                if self.blocked:
                    sent = self._sent[x.name]
                    self.err[x.name] = m.sub_(self._p[x.name] @ sent.t() if x.rank else sent)
                elif x.rank:
                    self.err[x.name] = m.sub_(approx[x.name])
        # M and what the wire carried are this step's: not kept beside the model until the next
        self._m, self._g, self._sent = {}, {}, {}
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
        for x, piece in zip(self._factored, self._unpack(mean1, 1)):
            self.q[x.name] = piece.t().clone()
        self.q_round = rnd
