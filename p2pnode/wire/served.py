"""The daemon-side mirror of this node's public model x̂, its delta log, and what to serve.

The training worker owns x̂ and publishes encoded payloads (bytes) with its
``worker.public.DeltaPublisher``. For a small model the daemon keeps its own numpy copy here
(:meth:`ServedModel.reset`), applying every published delta exactly as the worker did (float32
add of the decoded values); for a big one it keeps none and reads the worker's own x̂ from the
file the worker keeps it in (:meth:`ServedModel.attach`, wire/public_file.py), at the version it
has logged. Either way it answers ``GET /v1/model?since=V&epoch=E`` without asking the worker.
Three answers, cheapest first:

* ``since == version`` (same epoch): 304, empty body;
* ``since == version - 1``: the newest published bytes, unchanged (no re-encoding);
* ``since`` older but still in the log: one merged delta with **set** semantics: the union of
  the indices touched since ``since`` carrying the *current* x̂ values there. A summed ("add")
  merge would round differently from the one-by-one additions the server made; setting the
  current values makes every replica bit-equal to x̂, at the same size. Its values are float32:
  with ``chain`` asked for (``?chain=1``) and the deltas as published (back to back) smaller,
  those are served instead, each in its own value type (float16 or int8 kept);
* ``since=0`` with the asker's ``genesis`` digest equal to ours (wire/genesis.py: both nodes'
  version 0 is the same seeded initial model), whatever its epoch: as for a replica of ours at
  version 0, so a fresh peer's first fetch is a delta, not a snapshot;
* anything else (no/unknown/too old ``since``, other epoch): a full snapshot, cached per version,
  and with ``snapshot_max_age`` > 0 (the daemon's choice) kept for that long across newer
  versions while its version is still in the log: a replica built from it is brought up to
  date by the next delta, and a stream of snapshot requests costs one encoding per
  ``snapshot_max_age`` instead of one per published version.

Thread safety: one publisher thread and any number of server threads (``asyncio.to_thread``)
share one lock; decoding happens outside it, applying and encoding inside it. The event loop
may call :meth:`ServedModel.serve_now`, which only tries the lock and never encodes.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from p2pnode.wire.codec import MAX_CHAIN, decode, encode, encode_body, encode_parts
from p2pnode.wire.payload import Delta, ModelSpec, PayloadError, Snapshot
from p2pnode.wire.genesis import digest
from p2pnode.wire.msgview import Body
from p2pnode.wire.public_file import PublicReader
from p2pnode.wire.served_file import ReleasingParts, clean, write_snapshot

MiB = 1024 * 1024
#: indices merged by np.unique at most; more are merged through a mask (numpy's sort holds the GIL)
UNIQUE_MAX = 1 << 18
#: seconds a merged delta waits for the worker's file to be at the logged version (a publish the
#: worker wrote and the daemon has not logged yet) before a snapshot is served instead; and the
#: longest any answer waits for a publish under way in the file before it answers 503 (a worker
#: that died halfway through one)
MERGE_WAIT = 1.0
BEHIND_WAIT = 10.0


class _Behind(Exception):
    """The worker's file is not at the version logged here (yet): try again after the lock."""


class SnapshotBody:
    """A snapshot's encoding as parts (wire/codec.py encode_parts): its header, then the
    values of a copy of x̂ made when it was cached, never joined into one more copy. Its
    SHA-256 (for a signed answer) is computed once, when first asked for, in a thread."""

    def __init__(self, parts: list[bytes | memoryview] | list[Body] | ReleasingParts, sha256: str = "") -> None:
        self.parts = parts
        self.nbytes = sum(memoryview(p).nbytes for p in parts)
        self._sha256 = sha256  # known already when the parts were written to a file
        self._joined: bytes | None = None
        self._lock = threading.Lock()

    def sha256(self) -> str:
        with self._lock:
            if not self._sha256:
                h = hashlib.sha256()
                for part in self.parts:
                    h.update(part)
                self._sha256 = h.hexdigest()
            return self._sha256

    def join(self) -> bytes:
        """The parts as one ``bytes``, the same object each time (a copy: for small models)."""
        with self._lock:
            if self._joined is None:
                self._joined = b"".join(self.parts)
            return self._joined


@dataclass(frozen=True)
class ServeResult:
    """What the HTTP layer sends: ``status`` 200 (body = payload), 304 (nothing new, empty
    body) or 503 (nothing published yet: no snapshot); ``kind`` is "snapshot", "delta",
    "not_modified" or "unavailable"; ``version`` the publisher's current version. A snapshot's
    bytes are in ``snapshot`` (streamed from its parts), and so are a chain's (its logged deltas
    as they are, never joined into one more copy for a big answer); ``body`` joins them (tests,
    small answers)."""

    status: int
    data: Body
    kind: str
    version: int
    snapshot: SnapshotBody | None = None

    @property
    def body(self) -> Body:
        return self.snapshot.join() if self.snapshot is not None else self.data

    @property
    def nbytes(self) -> int:
        return self.snapshot.nbytes if self.snapshot is not None else len(self.data)


@dataclass(frozen=True)
class _LogEntry:
    version: int  # the delta takes x̂ from version - 1 to version
    data: Body  # exactly what the worker published (kept as it came: never copied)
    indices: dict[str, np.ndarray]  # touched flat indices (uint32), for merging
    nbytes: int
    #: kept without its indices (too big for the log with them: a big model's delta): served
    #: as it is to a replica one version behind, or in a chain, never merged across
    whole: bool = False


class ServedModel:
    """This node's x̂ as peers see it, with a log bounded by ``log_size`` entries and
    ``log_bytes`` bytes (raw payload bytes plus kept indices)."""

    def __init__(self, spec: ModelSpec, node_id: str, epoch: str, log_size: int = 64,
                 log_bytes: int = 64 * MiB, merge_cache: int = 8, snapshot_max_age: float = 0.0) -> None:
        self.spec = spec
        self.node_id = node_id
        self.log_size = log_size
        self.log_bytes = log_bytes
        self._merge_cache_size = merge_cache
        self._lock = threading.Lock()
        self._x: dict[str, np.ndarray] = {}
        self._file: PublicReader | None = None  # attach(): x̂ read from the worker's file
        self._epoch = epoch
        self._version = 0
        self._step = 0
        self._loss = 0.0
        self._ready = False
        self._genesis = ""  # digest of x̂ at version 0 of this epoch ("": reset at a later version)
        self._log: deque[_LogEntry] = deque()
        self._log_nbytes = 0
        self.snapshot_max_age = snapshot_max_age
        self._snapshot: tuple[int, SnapshotBody] | None = None
        self._snapshot_at = 0.0  # time.monotonic() of the cached snapshot's encoding
        self._merged: OrderedDict[int, Body] = OrderedDict()

    # -- state --------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def epoch(self) -> str:
        return self._epoch

    @property
    def genesis(self) -> str:
        """The digest of x̂ at version 0 (wire/genesis.py), or "" when this epoch began later
        (a resumed worker): what this node names in its own first fetches of its peers."""
        return self._genesis

    @property
    def ready(self) -> bool:
        """False until the first :meth:`reset`: there is nothing to serve before it."""
        return self._ready

    @property
    def log_len(self) -> int:
        return len(self._log)

    @property
    def log_nbytes(self) -> int:
        return self._log_nbytes

    # -- writer side ----------------------------------------------------------------------

    def reset(self, snapshot: Body | Snapshot) -> None:
        """Replace x̂ by a snapshot and adopt its epoch and version; the log starts empty
        (deltas of another epoch cannot be served). Raises PayloadError on a bad snapshot."""
        if isinstance(snapshot, Snapshot):
            # validate an in-memory payload exactly as one off the wire
            try:
                snapshot = encode(snapshot, snapshot.header.value_dtype)
            except ValueError as exc:
                raise PayloadError(str(exc)) from None
        payload = decode(snapshot, self.spec, max_bytes=len(snapshot))
        if not isinstance(payload, Snapshot):
            raise PayloadError("reset needs a snapshot")
        h = payload.header
        if h.node_id != self.node_id:
            raise PayloadError("snapshot of another node")
        x = {name: np.array(a, dtype=np.float32, copy=True) for name, a in payload.tensors.items()}
        genesis = digest(x, self.spec) if h.version == 0 else ""
        with self._lock:
            self._x = x
            self._file = None
            self._genesis = genesis
            self._epoch, self._version = h.epoch, h.version
            self._step, self._loss = h.step, h.loss
            self._log.clear()
            self._log_nbytes = 0
            self._snapshot = None
            self._merged.clear()
            self._ready = True

    def attach(self, reader: PublicReader, epoch: str, version: int, genesis: str = "") -> None:
        """Serve x̂ from the worker's file (wire/public_file.py) from now on, at ``version`` of
        ``epoch`` (``genesis``: its digest at version 0, as the worker computed it); the log starts
        empty. No copy of x̂ is made: snapshots and merged deltas read the file."""
        if reader.spec != self.spec:
            raise PayloadError("the public file holds another model")
        clean(Path(reader.path).parent)  # an earlier daemon's snapshot copies, half written
        _, _, step, loss = reader.state()
        with self._lock:
            self._x = {}
            self._file = reader
            self._genesis = genesis if version == 0 else ""
            self._epoch, self._version = epoch, version
            self._step, self._loss = step, loss
            self._log.clear()
            self._log_nbytes = 0
            self._snapshot = None
            self._merged.clear()
            self._ready = True

    def publish(self, data: Body) -> int:
        """Apply one encoded "add" delta (x̂[idx] += v in float32, as the worker did), log it,
        and return the new version. Raises PayloadError (x̂ unchanged) if it does not apply."""
        payload = decode(data, self.spec, max_bytes=max(len(data), 1))
        if not isinstance(payload, Delta) or payload.header.op != "add":
            raise PayloadError("publish needs an add delta")
        h = payload.header
        if h.node_id != self.node_id:
            raise PayloadError("delta of another node")
        if h.version != h.base_version + 1:
            raise PayloadError("a published delta must advance the version by one")
        nbytes = len(data) + 4 * sum(idx.size for idx, _ in payload.entries.values())
        whole = nbytes > self.log_bytes
        indices = {} if whole else {name: idx.astype(np.uint32) for name, (idx, _) in payload.entries.items()}
        with self._lock:
            if not self._ready:
                raise PayloadError("no snapshot published yet")
            if h.epoch != self._epoch:
                raise PayloadError("delta of another epoch")
            if h.base_version != self._version:
                raise PayloadError(f"delta base {h.base_version} != version {self._version}")
            applied = payload.entries if self._file is None else {}  # the worker's file holds them already
            for name, (idx, vals) in applied.items():
                x = self._x[name]
                if idx.size == x.size:  # every element (an adopted model published whole): idx is 0..n-1
                    x += vals  # the same float32 adds, without a gather and a scatter of the whole model
                else:
                    x[idx] += vals  # indices are unique: one float32 add each
            self._version, self._step, self._loss = h.version, h.step, h.loss
            if whole:
                # bigger than the log with its indices (a big model's delta, or one published
                # whole after an adoption): kept alone and without them, so that the newest
                # delta is always served as it is (else every fetch of a big model got a
                # snapshot); what came before it could only be merged across it: dropped
                self._log.clear()
                self._log_nbytes = 0
                nbytes = len(data)
            self._log.append(_LogEntry(h.version, data, indices, nbytes, whole))
            self._log_nbytes += nbytes
            while len(self._log) > 1 and (len(self._log) > self.log_size
                                          or self._log_nbytes > self.log_bytes):
                self._log_nbytes -= self._log.popleft().nbytes
            if self._snapshot is not None and not self._reusable(self._snapshot[0]):
                self._snapshot = None
            self._merged.clear()
            return self._version

    # -- reader side ----------------------------------------------------------------------

    def serve_now(self, since: int | None, epoch: str | None, genesis: str | None = None) -> ServeResult | None:
        """The answers that need no encoding (503, 304, the newest delta), if the lock is free
        right now; None otherwise (call :meth:`serve`, from a thread). Never blocks, so the
        event loop can answer most requests itself instead of hopping to a thread."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._serve_cheap(since, self._asked_epoch(since, epoch, genesis))
        finally:
            self._lock.release()

    def _asked_epoch(self, since: int | None, epoch: str | None, genesis: str | None) -> str | None:
        """The epoch the asker's replica is of: ours when it names our genesis at version 0
        (its own version 0 is ours, bit for bit). Caller holds the lock."""
        if genesis and since == 0 and genesis == self._genesis:
            return self._epoch
        return epoch

    def _serve_cheap(self, since: int | None, epoch: str | None) -> ServeResult | None:
        """503, 304 or the newest delta as published; None if the answer needs encoding.
        Caller holds the lock."""
        if not self._ready:
            return ServeResult(503, b"", "unavailable", -1)
        v = self._version
        if since is None or epoch != self._epoch:
            return None
        if since == v:
            return ServeResult(304, b"", "not_modified", v)
        if since == v - 1 and self._log:  # the log's last entry is always version v
            return ServeResult(200, self._log[-1].data, "delta", v)
        return None

    def serve(self, since: int | None, epoch: str | None, chain: bool = False,
              genesis: str | None = None) -> ServeResult:
        """The answer to ``GET /v1/model?since=&epoch=[&chain=1][&genesis=]`` (module docstring).
        From a thread: it may encode, and wait for the worker's file to reach the logged version."""
        began = time.monotonic()
        while True:
            waited = time.monotonic() - began
            try:
                # a merged delta needs x̂ at the logged version: after MERGE_WAIT a snapshot,
                # which takes the file at any version, so that no thread waits long for the log
                return self._serve(since, epoch, chain, genesis, merge=waited < MERGE_WAIT)
            except _Behind:
                if waited > BEHIND_WAIT:  # e.g. a worker that died halfway through a publish
                    return ServeResult(503, b"", "unavailable", self._version)
                time.sleep(0.005)

    def _values(self, indices: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """x̂ at the logged version: a copy of every tensor, or the values at ``indices``.
        Caller holds the lock; raises _Behind when the worker's file is elsewhere just now."""
        if self._file is None:
            if indices is None:
                return {name: a.copy() for name, a in self._x.items()}
            return {name: self._x[name][idx] for name, idx in indices.items()}
        got = self._file.read(self._version, indices)
        if got is None:
            raise _Behind
        return got

    def _snapshot_values(self) -> tuple[int, int, float, dict[str, np.ndarray]]:
        """(version, step, loss, a copy of x̂) for a snapshot. From the worker's file, at the
        version the file is at, which may be a publish ahead of the log (the worker wrote it
        and its delta is on the way): a snapshot needs no delta, and the log's next entries
        continue from it. Caller holds the lock; raises _Behind while a publish is under way."""
        if self._file is None:
            return self._version, self._step, self._loss, self._values()
        got = self._file.read_any()
        if got is None or got[0] < self._version:
            raise _Behind
        return got

    def _serve(self, since: int | None, epoch: str | None, chain: bool, genesis: str | None,
               merge: bool = True) -> ServeResult:
        with self._lock:
            epoch = self._asked_epoch(since, epoch, genesis)
            cheap = self._serve_cheap(since, epoch)
            if cheap is not None:
                return cheap
            v = self._version
            if since is not None and epoch == self._epoch:
                oldest_base = self._log[0].version - 1 if self._log else v
                parts = list(islice(self._log, max(0, since - oldest_base), None))  # versions > since
                if oldest_base <= since < v and any(e.whole for e in parts):
                    # no merge across a delta kept without its indices: the deltas as published,
                    # if they weigh less than a snapshot, else a snapshot (below)
                    if chain and len(parts) <= MAX_CHAIN and sum(len(e.data) for e in parts) < 4 * self.spec.numel:
                        return ServeResult(200, b"", "chain", v, SnapshotBody([e.data for e in parts]))
                elif oldest_base <= since < v and merge:
                    merged = self._merged_since(since)
                    if chain and v - since <= MAX_CHAIN:
                        parts = list(islice(self._log, since - oldest_base, None))  # versions > since
                        if sum(len(e.data) for e in parts) < len(merged):
                            return ServeResult(200, b"", "chain", v, SnapshotBody([e.data for e in parts]))
                    return ServeResult(200, merged, "delta", v)
            if self._snapshot is None or (self._snapshot[0] < v and not self._reusable(self._snapshot[0])):
                self._snapshot = None  # the old copy goes before the new one is made
                if self._file is not None:  # a big model: the copy in a file (wire/served_file.py)
                    made = write_snapshot(self._file, self.spec, self.node_id, self._epoch,
                                          Path(self._file.path).parent)
                    if made is None or made[0] < self._version:
                        raise _Behind
                    self._snapshot = (made[0], SnapshotBody(made[1], made[3]))
                else:
                    at, step, loss, copy = self._snapshot_values()  # publishes go on while it streams
                    header = self.spec.header("snapshot", self.node_id, self._epoch, at,
                                              base_version=-1, step=step, loss=loss)
                    self._snapshot = (at, SnapshotBody(encode_parts(Snapshot(header, copy))))
                self._snapshot_at = time.monotonic()
            return ServeResult(200, b"", "snapshot", self._snapshot[0], self._snapshot[1])

    def _reusable(self, version: int) -> bool:
        """Whether the cached snapshot of ``version`` may still be served: young enough, and a
        delta from it still in the log. Caller holds the lock."""
        if self.snapshot_max_age <= 0 or time.monotonic() - self._snapshot_at > self.snapshot_max_age:
            return False
        return bool(self._log) and self._log[0].version - 1 <= version

    def _merged_since(self, since: int) -> Body:
        """A "set" delta from ``since`` to now; caller holds the lock."""
        body = self._merged.get(since)
        if body is not None:
            self._merged.move_to_end(since)
            return body
        start = since - (self._log[0].version - 1)  # first entry with version > since
        touched: dict[str, list[np.ndarray]] = {}
        for entry in islice(self._log, start, None):
            for name, idx in entry.indices.items():
                touched.setdefault(name, []).append(idx)
        sizes = {t.name: t.numel for t in self.spec.tensors}
        union: dict[str, np.ndarray] = {}
        for name, parts in touched.items():
            numel = sizes[name]
            if len(parts) == 1:
                idx = parts[0]
            elif sum(p.size for p in parts) > min(numel // 8, UNIQUE_MAX):  # dense publishes, big ones:
                # a mask is O(numel); unique's hash was 0.1 s a tensor, and its sort holds the
                # GIL (3.6 s of a daemon's event loop for a 30M-parameter model's merged delta)
                mask = np.zeros(numel, dtype=bool)
                for part in parts:
                    mask[part] = True
                idx = np.flatnonzero(mask).astype(parts[0].dtype)
            else:
                idx = np.unique(np.concatenate(parts))
            union[name] = idx
        values = self._values(union)
        entries = {name: (idx, values[name]) for name, idx in union.items()}
        header = self.spec.header("delta", self.node_id, self._epoch, self._version,
                                  base_version=since, step=self._step, loss=self._loss,
                                  op="set")
        body = encode_body(Delta(header, entries))  # GIL-free copies: a daemon thread beside the loop
        self._merged[since] = body
        # bounded in bytes as the log is: a big model's merged deltas are tens of MB each
        while len(self._merged) > self._merge_cache_size or (
                len(self._merged) > 1 and sum(len(b) for b in self._merged.values()) > self.log_bytes):
            self._merged.popitem(last=False)
        return body
