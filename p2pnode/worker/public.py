"""The worker's side of publishing: this node's public copy x_hat and the sparse deltas that
publish it (CHOCO-Gossip). The daemon's side, which stores and serves them, is
``p2pnode.wire.served.ServedModel``.

publish: q = C(x - x_hat) per tensor with the configured sparsifier; x_hat += q; version += 1.
What C leaves out stays in x - x_hat and goes out in a later publish, so nothing is lost.
x_hat is updated with exactly the values put on the wire (after float16 rounding when that is
the wire type), so every replica built from the wire equals it bit for bit.

For a model of ``DISK_FROM`` float32 bytes or more (given a folder), x_hat lives in a file
mapped into the worker (wire/public_file.py) that the daemon reads to serve it: the daemon then
keeps no model-sized copy of its own, and the hello carries no snapshot.
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from p2pnode.compression.base import Sparsifier
from p2pnode.compression.sized import publish_selector
from p2pnode.wire.codec import delta_parts, encode, join
from p2pnode.wire.genesis import digest
from p2pnode.wire.public_file import NAME as PUBLIC_FILE
from p2pnode.wire.public_file import PublicFile
from p2pnode.wire.replica import DISK_FROM
from p2pnode.wire.payload import Delta, Header, ModelSpec, Snapshot
from p2pnode.wire.rounding import round_for_wire, rounded


#: tensors up to this many values get x - x_hat in a buffer kept between publishes
SCRATCH_MAX = 1 << 24

#: attribute of a model holding the name patterns its task keeps local (``Task.keep_local``)
KEEP_LOCAL = "p2pnode_keep_local"


def floating_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state entries that are averaged and published: trainable parameters and floating
    buffers (BatchNorm's running mean and variance are averaged like weights: a model averaged
    with stale statistics of its own evaluates badly), each tensor once.

    Left out: integer buffers (BatchNorm's ``num_batches_tracked`` is a local count, never
    averaged), frozen parameters (``requires_grad`` False: every node keeps the same initial
    values, so there is nothing to send), what the task keeps local (fnmatch patterns of state
    names, e.g. ``*.running_*`` for BatchNorm statistics of each node's own data) and a tied
    tensor's second name (sent once, under its first name; averaging it once updates both)."""
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    local = getattr(model, KEEP_LOCAL, ())  # the task's choice (p2pnode/tasks/base.py: keep_local)
    if local:
        frozen |= {name for name in model.state_dict() if any(fnmatch.fnmatchcase(name, pat) for pat in local)}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point() or name in frozen:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


class DeltaPublisher:
    """Owns x_hat; each ``publish`` moves it towards the model and returns the encoded delta."""

    def __init__(self, model: nn.Module, spec: ModelSpec, sparsifier: Sparsifier, node_id: str,
                 epoch: str, version: int, value_dtype: str = "float32", folder: Path | None = None) -> None:
        self.model = model
        self.spec = spec
        self.sparsifier = sparsifier
        #: what selects: exact top-k becomes SizedTopK (an estimated threshold on big tensors)
        self.selector = publish_selector(sparsifier)
        #: the last publish's (entries selected, entries sent, values in the model)
        self.counts = (0, 0, 0)
        self.node_id = node_id
        self.epoch = epoch
        self.version = version
        self.value_dtype = value_dtype
        #: a sparsifier that keeps every entry (top-k at density 1: an adaptive optimizer's
        #: gossip, config/adaptive_gossip.py): no selection, and the indices a shared range
        self.every_entry = getattr(sparsifier, "density", None) == 1.0
        self._range = np.zeros(0, dtype=np.uint32)  # _every's
        self._diff = torch.empty(0)  # _minus's
        #: x_hat in a file the daemon reads (a big model), or None: x_hat in this process only
        self.file: PublicFile | None = None
        # x_hat lives on the CPU whatever training.device is: it is what goes on the wire
        if folder is not None and 4 * spec.numel >= DISK_FROM and all(t.dtype == "float32" for t in spec.tensors):
            self.file = PublicFile(folder / PUBLIC_FILE, spec,
                                   {k: v.detach().reshape(-1).to("cpu", torch.float32).numpy()
                                    for k, v in floating_state(model).items()}, version)
            self.xhat = {k: torch.from_numpy(a) for k, a in self.file.arrays.items()}
        else:
            self.xhat = {k: v.detach().reshape(-1).to("cpu", torch.float32, copy=True)
                         for k, v in floating_state(model).items()}

    def let_go(self, name: str | None = None) -> None:
        """With x_hat in a file: tensor ``name``'s pages (every tensor's: None) out of the
        resident set once read or written (wire/public_file.py); x_hat in memory: nothing."""
        if self.file is not None:
            self.file.release(name)

    def _every(self, n: int) -> np.ndarray:
        """0..n-1 as uint32, a view of one range kept for the biggest tensor asked for."""
        if self._range.size < n:
            self._range = np.arange(n, dtype=np.uint32)
        return self._range[:n]

    def _minus(self, current: torch.Tensor, xhat: torch.Tensor, keep: bool) -> torch.Tensor:
        """x - x_hat of one tensor, into a buffer kept from one tensor and publish to the next
        (a fresh 16 MB result cost 14-49 ms of page faults on the loaded 2-core machine, the
        kept one 2-21 ms); a fresh one when the result is kept (``keep``: a whole publish sends
        it as it is) or the tensor is bigger than ``SCRATCH_MAX`` values (a buffer the size of a
        50k-token embedding would stay resident between publishes)."""
        n = xhat.numel()
        flat = current.reshape(-1).to("cpu", torch.float32)
        if keep or n > SCRATCH_MAX:
            return flat - xhat
        if self._diff.numel() < n:
            self._diff = torch.empty(n)
        return torch.sub(flat, xhat, out=self._diff[:n])

    def _header(self, kind: str, base: int, step: int, loss: float) -> Header:
        loss = loss if math.isfinite(loss) else -1.0  # -1: not known yet (before the first step)
        return Header(kind=kind, fingerprint=self.spec.fingerprint, node_id=self.node_id, epoch=self.epoch,
                      base_version=base, version=self.version, step=step, loss=loss,
                      specs=list(self.spec.tensors))

    def snapshot(self, step: int, loss: float) -> bytes:
        tensors = {k: v.numpy() for k, v in self.xhat.items()}
        return encode(Snapshot(self._header("snapshot", self.version, step, loss), tensors))

    def hello_fields(self, step: int, loss: float) -> tuple[bytes, str, str]:
        """What a Hello says of x_hat: (snapshot, public_file, genesis): a snapshot, or with a
        file its path and the genesis digest (the daemon reads the rest from the file: no
        model-sized message)."""
        if self.file is None:
            return self.snapshot(step, loss), "", ""
        self.file.end(self.version, step, loss if math.isfinite(loss) else -1.0)
        genesis = digest({k: v.numpy() for k, v in self.xhat.items()}, self.spec) if self.version == 0 else ""
        self.let_go()
        return b"", str(self.file.path), genesis

    def publish(self, step: int, loss: float, full: bool = False) -> bytes:
        """:meth:`publish_parts` as one body."""
        return join(self.publish_parts(step, loss, full))

    @torch.no_grad()
    def publish_parts(self, step: int, loss: float, full: bool = False) -> list[bytes | memoryview]:
        """The next delta, encoded in parts (wire/codec.py ``delta_parts``: the worker sends them
        down its pipe as they are): the sparsifier's choice of x - x_hat, or with ``full`` every
        entry (after adopting a peer's model, so x_hat is the model at once, not a few publishes
        on: a public copy half old, half adopted is far from every peer's, an outlier to them)."""
        entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        current = floating_state(self.model)
        selected = 0
        for name, xhat in self.xhat.items():
            diff = self._minus(current[name], xhat, keep=full or self.every_entry)
            self.let_go(name)
            if self.every_entry and not full:
                # every entry, rounded to the wire's values and sent even where that is 0 (x_hat
                # adds 0 there): a range of indices, where a top-k's index arrays and gathers held
                # twice the model's float32 bytes at once (scripts/bench_memory.py --whole-copies)
                values = rounded(diff.numpy(), self.value_dtype)
                entries[name] = (self._every(diff.numel()), values)
                selected += diff.numel()
                continue
            if full and bool((diff != 0).all()):
                # every entry moved (an adopted model): its indices are 0..n-1, a view of one
                # shared range, not an index array per tensor (a whole model's 4 bytes an entry)
                entries[name] = (self._every(diff.numel()), diff.numpy())
                selected += diff.numel()
                continue
            idx = torch.arange(diff.numel()) if full else self.selector.select(diff)
            selected += idx.numel()
            if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):  # a threshold's come sorted
                idx = torch.sort(idx).values
            picked = diff.index_select(0, idx)
            moved = picked != 0
            if not bool(moved.all()):  # a top-k of a model that has not moved would send k zeros
                idx, picked = idx[moved], picked[moved]
            if idx.numel() == 0:
                continue
            # what the wire carries (a full publish is float32: x_hat becomes the model at once)
            idx_np, values = round_for_wire(idx.numpy(), picked.numpy(), "float32" if full else self.value_dtype)
            if idx_np.size == 0:
                continue
            entries[name] = (idx_np.astype(np.uint32), values)
        # x_hat changes only now, all tensors at once after the selection (which takes seconds
        # for a big model): the daemon's reads of a file x_hat retry only over this short span
        if self.file is not None:
            self.file.begin()
        for name, (idx_np, values) in entries.items():
            xhat = self.xhat[name]
            if idx_np.size == xhat.numel():  # every entry: the same float32 adds, no gather
                xhat.add_(torch.from_numpy(values))
            else:
                xhat.index_add_(0, torch.from_numpy(idx_np.astype(np.int64)), torch.from_numpy(values))
            self.let_go(name)
        self.counts = (selected, sum(v.size for _, v in entries.values()), sum(x.numel() for x in self.xhat.values()))
        base = self.version
        self.version += 1
        if self.file is not None:
            self.file.end(self.version, step, loss if math.isfinite(loss) else -1.0)
        return delta_parts(Delta(self._header("delta", base, step, loss), entries),
                           value_dtype="float32" if full else self.value_dtype)
