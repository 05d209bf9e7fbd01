"""Replicas of peers' public models x̂, kept by the training worker.

A replica is bit-equal to the peer's x̂ at ``(epoch, version)``: a snapshot replaces it, an
"add" delta adds the decoded float32 values (the same single float32 addition the peer made),
a "set" (merged) delta writes the peer's current values. Everything is checked before
anything is written, so a payload that is refused leaves the replica as it was.

A replica's values are flat float32 numpy arrays (``arrays``; the update arithmetic is numpy's,
identical to the publisher's); ``tensors`` gives torch views of them, which the worker reshapes
to its model's shapes to average them in. torch is imported only for those views, so a
torch-free process (the stub worker) keeps replicas too. Treat both as read-only: writing to
them breaks bit-equality. Not thread-safe: one owner (the worker's exchange loop).

Where the values live (wire/store.py): in memory for small models; for a model of
``disk_from`` float32 bytes or more, given a folder, in one file per replica, read and written
a tensor at a time, so that 16 replicas of a 1 GB model cost 16 GB of disk (and page cache the
kernel may reclaim), not 16 GB of the worker's memory. ``arrays`` and ``tensors`` are then
mappings that read a tensor from the file each time one is looked up.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from p2pnode.wire.codec import DEFAULT_MAX_BYTES, Release, decode, encode, split_chain
from p2pnode.wire.payload import (
    ArchitectureMismatch,
    Delta,
    ModelSpec,
    Payload,
    PayloadError,
    Snapshot,
    mismatch,
)
from p2pnode.wire.store import ArrayStore, FileStore, MemoryStore, stash


if TYPE_CHECKING:
    import torch


class ReplicaGap(PayloadError):
    """A delta that does not start where the replica is (other base version or epoch, or no
    snapshot yet): ask again with the replica's ``(epoch, version)``, or without ``since``."""


class Replica:
    """One peer's x̂. ``version`` is -1 and ``epoch`` "" until the first snapshot."""

    def __init__(self, spec: ModelSpec, node_id: str, store: ArrayStore | None = None) -> None:
        self.spec = spec
        self.node_id = node_id
        self.epoch = ""
        self.version = -1
        self.step = 0
        self.loss = math.nan
        #: flat float32, one per tensor of the spec (empty until the first snapshot)
        self.store: ArrayStore = store if store is not None else MemoryStore()

    @classmethod
    def from_genesis(cls, spec: ModelSpec, node_id: str, epoch: str, genesis: Mapping[str, np.ndarray],
                     store: ArrayStore | None = None) -> Replica:
        """A replica of ``node_id``'s x̂ at version 0 of ``epoch``, which its server found equal
        to our own version 0 (``genesis``, flat float32 per tensor; wire/genesis.py)."""
        r = cls(spec, node_id, store)
        for t in spec.tensors:
            values = np.asarray(genesis[t.name], dtype=np.float32).reshape(-1)
            if values.size != t.numel:
                r.store.close()
                raise PayloadError("our genesis does not fit this model")
            r.store.write(t.name, values)
        r.epoch, r.version = epoch, 0
        return r

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        """The values, tensor by tensor (read from the file each time with a file store)."""
        return self.store

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """Torch views of :attr:`arrays` (no copy beyond a file store's read)."""
        return _TorchView(self.store)

    @property
    def ready(self) -> bool:
        return self.version >= 0

    def apply(self, payload: Payload, *, validate: bool = True, release: Release | None = None) -> None:
        """Apply a snapshot or delta; raise PayloadError (nothing changed) if it does not fit.

        ``validate=False`` is for payloads just returned by ``decode(data, self.spec)``:
        their arrays are already checked. Otherwise the payload is re-checked in full.
        ``release``: called with each tensor's values once written (a mapped body's pages go).
        """
        h = payload.header
        if h.fingerprint != self.spec.fingerprint:
            raise ArchitectureMismatch(mismatch(h.fingerprint, self.spec.fingerprint))
        if h.specs != self.spec.tensors:
            raise ArchitectureMismatch("payload describes another model")
        if h.node_id != self.node_id:
            raise PayloadError("payload of another node")
        if isinstance(payload, Delta):
            if not self.ready:
                raise ReplicaGap("no snapshot yet")
            if h.epoch != self.epoch:
                raise ReplicaGap("peer epoch changed")
            if h.base_version != self.version:
                raise ReplicaGap(f"delta base {h.base_version} != replica {self.version}")
        if validate:  # the wire checks, for payloads that did not come off the wire
            try:
                data = encode(payload, h.value_dtype)
            except ValueError as exc:  # the encoder's own refusal
                raise PayloadError(str(exc)) from None
            payload = decode(data, self.spec, max_bytes=len(data))
        if isinstance(payload, Snapshot):
            for s in self.spec.tensors:
                self.store.write(s.name, np.asarray(payload.tensors[s.name], dtype=np.float32).reshape(-1))
                if release is not None:
                    release(payload.tensors[s.name])
        else:
            for name, (idx, vals) in payload.entries.items():
                values = self.store.for_update(name)
                if h.op == "set":
                    values[idx] = vals
                else:
                    values[idx] += vals  # unique indices: one float32 add each
                self.store.write(name, values)
                if release is not None:
                    release(vals)
        self.epoch, self.version, self.step, self.loss = h.epoch, h.version, h.step, h.loss


class _TorchView(Mapping[str, "torch.Tensor"]):
    """``store``'s arrays as torch tensors, each made when looked up."""

    def __init__(self, store: ArrayStore) -> None:
        self.store = store

    def __getitem__(self, name: str) -> torch.Tensor:
        import torch

        return torch.from_numpy(self.store[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)


#: float32 bytes of a model from which replicas live in files (when the cache has a folder):
#: below, a replica costs little memory and a file only adds reads and writes
DISK_FROM = 64 * 1024 * 1024
_SERIAL = itertools.count()


class ReplicaCache:
    """At most ``max_replicas`` replicas, least recently used evicted first. With ``folder``,
    replicas of models of ``disk_from`` float32 bytes or more are files there (the folder is
    emptied first: a new worker has no replicas)."""

    def __init__(self, max_replicas: int, folder: Path | None = None, disk_from: int = DISK_FROM) -> None:
        if max_replicas < 1:
            raise ValueError("max_replicas must be >= 1")
        self.max_replicas = max_replicas
        self.folder = folder
        self.disk_from = disk_from
        self._replicas: OrderedDict[str, Replica] = OrderedDict()
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.replica"):
                old.unlink(missing_ok=True)

    def _store(self, spec: ModelSpec) -> ArrayStore:
        """Where a new replica of a model of ``spec`` keeps its values."""
        if self.folder is None or 4 * spec.numel < self.disk_from:
            return MemoryStore()
        return FileStore(self.folder / f"{next(_SERIAL)}.replica", spec)

    def _drop(self, replica: Replica | None, keep: Replica | None = None) -> None:
        if replica is not None and replica is not keep:
            replica.store.close()

    def __len__(self) -> int:
        return len(self._replicas)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._replicas

    def get(self, node_id: str) -> Replica | None:
        r = self._replicas.get(node_id)
        if r is not None:
            self._replicas.move_to_end(node_id)
        return r

    def apply(self, node_id: str, data: bytes | bytearray | memoryview, expect: ModelSpec,
              max_bytes: int = DEFAULT_MAX_BYTES, genesis: Mapping[str, np.ndarray] | None = None,
              release: Release | None = None) -> Replica:
        """Decode ``data`` from peer ``node_id`` and apply it; on any error (PayloadError and
        subclasses) the cache is unchanged. ``data`` may be a chain (``?chain=1``): deltas back
        to back, each from the version the one before it reached; all are decoded and checked
        to follow on before the first is applied. ``genesis``: our own x̂ at version 0, given
        when the fetch named its digest and so a delta from version 0 starts from it (the
        server answers so only when its version 0 is the same; wire/genesis.py). ``release``: a
        body mapped from a file (wire/mapped.py) lets each tensor's pages go once checked, and
        again once applied, so that it is never resident whole."""
        if len(data) > max_bytes:
            raise PayloadError(f"payload too large ({len(data)} > {max_bytes} bytes)")
        payloads = [decode(part, expect, max_bytes, release) for part in split_chain(data)]
        first = payloads[0]
        for before, after in zip(payloads, payloads[1:]):
            if not isinstance(after, Delta) or after.header.epoch != before.header.epoch \
                    or after.header.base_version != before.header.version:
                raise PayloadError("chained deltas do not follow on")
        if any(p.header.node_id != node_id for p in payloads):
            raise PayloadError("payload of another node")
        old = replica = self._replicas.get(node_id)
        if isinstance(first, Snapshot):
            replica = Replica(expect, node_id, self._store(expect))  # the old one stays intact until this works
        elif genesis is not None and first.header.base_version == 0 and (
                replica is None or replica.epoch != first.header.epoch or replica.version != 0):
            # the old one stays until this works
            replica = Replica.from_genesis(expect, node_id, first.header.epoch, genesis, self._store(expect))
        elif replica is None:
            raise ReplicaGap("no replica of this peer")
        elif replica.spec != expect:
            raise ArchitectureMismatch("replica kept for another model")
        elif first.header.epoch != replica.epoch or first.header.base_version != replica.version:
            # checked before anything is applied, so that a chain never leaves the replica half way
            raise ReplicaGap(f"delta base {first.header.epoch}/{first.header.base_version} != "
                             f"replica {replica.epoch}/{replica.version}")
        try:
            for payload in payloads:
                replica.apply(payload, validate=False, release=release)
        except BaseException:
            self._drop(replica, keep=old)
            raise
        self._drop(old, keep=replica)
        self._replicas[node_id] = replica
        self._replicas.move_to_end(node_id)
        while len(self._replicas) > self.max_replicas:
            self._drop(self._replicas.popitem(last=False)[1])
        return replica


#: the folder of a node's state dir where its worker keeps replicas of big models
REPLICA_DIR = "replicas"


def replica_folder(state_dir: str | Path) -> Path:
    return Path(state_dir) / REPLICA_DIR


def keep_genesis(state_dir: str | Path, spec: ModelSpec, xhat: Mapping[str, object]) -> Mapping[str, np.ndarray]:
    """The worker's x̂ at version 0 (flat float32 per tensor, e.g. torch CPU tensors), kept for
    the replicas that start from it: copied in memory for a small model, in a file read back a
    tensor at a time for one of ``DISK_FROM`` bytes or more (a whole model's copy held in the
    worker for its life otherwise)."""
    if 4 * spec.numel < DISK_FROM:
        return {k: np.array(v, dtype=np.float32, copy=True).reshape(-1) for k, v in xhat.items()}
    return stash(replica_folder(state_dir), "genesis.f32", spec, {k: np.asarray(v) for k, v in xhat.items()})
