"""A big model's public copy x̂ in one file: the worker's x̂ itself, read by the daemon to serve.

For a model of ``DISK_FROM`` float32 bytes or more the worker keeps x̂ in this file, mapped into
its memory (``PublicFile``: the arrays it publishes from are views of the mapping), and the
daemon serves snapshots and merged deltas by reading the file (``PublicReader``, ``pread``: the
pages are never mapped into the daemon, so they are not in its resident set). The daemon then
holds no model-sized mirror of x̂ of its own, and the worker's hello carries no snapshot.

Layout: a header (magic, a sequence number, version, step, loss, the model's spec as JSON), then
the tensors' float32 values back to back in the spec's order from a page boundary.

The worker touches x̂ only while it publishes (the selection reads every tensor, the update
writes the selected entries). After it has done with a tensor it lets that tensor's pages go
(``release``: ``madvise(MADV_DONTNEED)``; the values stay in the file's page cache, dirty or
not), so x̂ is not in the worker's resident set between publishes, and a publish holds about one
tensor of it at a time, not the whole model: the kernel may write the pages out and take them
back under memory pressure, as it cannot with the worker's own memory.

A read must see x̂ at one version, never half a publish. The worker changes x̂ only between
``begin`` and ``end``, which make the sequence number odd and then even again (a *seqlock*); a
reader reads the header, the values, then the sequence number again, and keeps what it read only
if the number was even and did not change and the version is the one it wants. A reader never
blocks the worker. (Ordering: the writer's stores and the reader's loads are each seen in
program order on x86-64, the machines this runs on; ``pread`` is a system call, itself a full
barrier on the reader's side.)
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import weakref
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from p2pnode.wire.payload import ModelSpec, PayloadError, TensorSpec
from p2pnode.wire.unlink import close as close_in_thread

MAGIC = b"P2PXHAT1"
#: magic, sequence (u64), version (i64), step (i64), loss (f64), spec length (u32)
_HEAD = struct.Struct("<8sQqqdI")
_STATE = struct.Struct("<Qqqd")  # the part a reader reads again: sequence, version, step, loss
_STATE_AT = 8
_SPEC_AT = 64
PAGE = 4096
#: the file's name in the worker's scratch folder (replica_folder)
NAME = "public.xhat"


def _data_at(spec_len: int) -> int:
    return -(-(_SPEC_AT + spec_len) // PAGE) * PAGE


def _spec_json(spec: ModelSpec) -> bytes:
    return json.dumps({"fp": spec.fingerprint,
                       "specs": [[t.name, list(t.shape), t.dtype] for t in spec.tensors]}).encode()


def _offsets(spec: ModelSpec, at: int) -> dict[str, tuple[int, int]]:
    out = {}
    for t in spec.tensors:
        out[t.name] = (at, t.numel)
        at += 4 * t.numel
    return out


def _unlink(path: str, inode: int) -> None:
    """Remove ``path`` if it is still our file (a newer worker's file of that name stays)."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


class PublicFile:
    """The worker's side: x̂ in ``path`` (made anew: a file left by an earlier worker is removed
    first, so a daemon still reading that one keeps its own), filled with ``arrays``.
    :attr:`arrays` are writable views of the mapping; change them only between :meth:`begin`
    and :meth:`end`. The file is removed when this object is closed or collected."""

    def __init__(self, path: Path, spec: ModelSpec, arrays: Mapping[str, np.ndarray], version: int,
                 step: int = 0, loss: float = -1.0) -> None:
        if any(t.dtype != "float32" for t in spec.tensors):
            raise ValueError("a public file holds float32 tensors only")
        self.path = path
        self.spec = spec
        spec_bytes = _spec_json(spec)
        data_at = _data_at(len(spec_bytes))
        size = data_at + 4 * spec.numel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)  # MAP_SHARED: the daemon's reads see these pages
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self._closer = weakref.finalize(self, _unlink, str(path), inode)
        self._map[:_SPEC_AT] = _HEAD.pack(MAGIC, 0, version, step, loss, len(spec_bytes)).ljust(_SPEC_AT, b"\0")
        self._map[_SPEC_AT:_SPEC_AT + len(spec_bytes)] = spec_bytes
        self._seq = np.frombuffer(self._map, dtype="<u8", count=1, offset=_STATE_AT)
        self.arrays: dict[str, np.ndarray] = {}
        self._where = _offsets(spec, data_at)
        for name, (at, numel) in self._where.items():
            view = np.frombuffer(self._map, dtype=np.float32, count=numel, offset=at)
            view[:] = np.asarray(arrays[name], dtype=np.float32).reshape(-1)
            self.arrays[name] = view
            self.release(name)

    def release(self, name: str | None = None) -> None:
        """Tensor ``name``'s pages (every tensor's: None) out of this process's resident set;
        its values stay in the file (module docstring). The views in :attr:`arrays` stay valid: a
        later access reads the pages back from the page cache."""
        if name is None:
            at, end = _SPEC_AT, len(self._map)
        else:
            at, numel = self._where[name]
            end = at + 4 * numel
        start = at - at % PAGE
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def begin(self) -> None:
        """x̂ is about to change: readers now retry (the sequence number is odd)."""
        seq = int(self._seq[0])
        self._seq[0] = seq + 1 - (seq & 1)

    def end(self, version: int, step: int, loss: float) -> None:
        """x̂ is now at ``version`` (its step and loss as published). The version is written
        while the sequence number is still odd, the number last."""
        self.begin()
        self._map[_STATE_AT + 8:_STATE_AT + _STATE.size] = _STATE.pack(0, version, step, loss)[8:]
        self._seq[0] += 1

    def close(self) -> None:
        """Remove the file (a daemon that opened it keeps reading what it holds)."""
        self._closer()


class PublicReader:
    """The daemon's side: reads x̂ from a :class:`PublicFile` at one version (module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        self._closer = weakref.finalize(self, close_in_thread, self._fd)  # wire/unlink.py
        head = os.pread(self._fd, _HEAD.size, 0)
        if len(head) != _HEAD.size or head[:8] != MAGIC:
            self.close()
            raise PayloadError(f"{self.path} is not a public model file")
        spec_len = _HEAD.unpack(head)[5]
        try:
            raw = json.loads(os.pread(self._fd, spec_len, _SPEC_AT))
            self.spec = ModelSpec(str(raw["fp"]), [TensorSpec(str(n), tuple(int(d) for d in s), str(dt))
                                                   for n, s, dt in raw["specs"]])
        except (ValueError, KeyError, TypeError) as exc:
            self.close()
            raise PayloadError(f"{self.path}: bad model spec ({exc})") from None
        data_at = _data_at(spec_len)
        if os.fstat(self._fd).st_size != data_at + 4 * self.spec.numel:
            self.close()
            raise PayloadError(f"{self.path}: size does not match its spec")
        self._where = _offsets(self.spec, data_at)

    def state(self) -> tuple[int, int, int, float]:
        """(sequence, version, step, loss) now; an odd sequence: a publish is under way."""
        seq, version, step, loss = _STATE.unpack(os.pread(self._fd, _STATE.size, _STATE_AT))
        return int(seq), int(version), int(step), float(loss)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor's values now, a fresh array (no version check: the caller reads
        :meth:`state` before and after, as :meth:`read_any` does)."""
        return self._tensor(name)

    def _tensor(self, name: str) -> np.ndarray:
        at, numel = self._where[name]
        out = np.empty(numel, dtype=np.float32)
        view = out.data.cast("B")
        done = 0
        while done < view.nbytes:  # preadv lets go of the GIL
            n = os.preadv(self._fd, [view[done:]], at + done)
            if n <= 0:
                raise OSError(f"{self.path} ended early")
            done += n
        return out

    def read(self, version: int, indices: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray] | None:
        """x̂'s values at ``version``: every tensor (fresh arrays), or only those at ``indices``
        per tensor; None if the file is not at that version now or a publish changed it while it
        was read (try again)."""
        got = self.read_any(indices)
        return got[3] if got is not None and got[0] == version else None

    def read_any(self, indices: Mapping[str, np.ndarray] | None = None
                 ) -> tuple[int, int, float, dict[str, np.ndarray]] | None:
        """(version, step, loss, values) at whatever version the file is now; None if a publish
        was under way or changed it while it was read (try again)."""
        seq, version, step, loss = self.state()
        if seq & 1:
            return None
        out: dict[str, np.ndarray] = {}
        names = self.spec.names if indices is None else list(indices)
        for name in names:
            values = self._tensor(name)
            out[name] = values if indices is None else values[indices[name]]
        if self.state()[0] != seq:
            return None
        return version, step, loss, out

    def close(self) -> None:
        self._closer()
