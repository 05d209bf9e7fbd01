"""A big model's snapshot, as the daemon serves it, encoded into a file rather than into memory.

A snapshot answer must be one fixed body: its SHA-256 is signed before its headers go out, and
it streams for as long as the link takes, while the worker keeps publishing into its file
(wire/public_file.py). So it cannot be streamed straight from the worker's file; it was copied
whole into the daemon's memory (0.8-1x the model, for as long as it was cached). Here the copy
goes to a file beside the worker's, a tensor at a time: each tensor is read from the worker's
file (``pread``), checked, written and hashed, then dropped, and the worker's sequence number
is read again at the end (a publish under way or done meanwhile: the copy is thrown away and
tried again, as a read of the whole file was). The finished file is mapped read-only, and the
answer streams from the mapping, each slice's pages let go once written (net/stream.py
``PartsResponse``, wire/mapped.py). The file keeps its name until the mapping is gone and is
then removed by the unlinking thread (wire/unlink.py): unlinked at once, as it was, its blocks
were freed by whoever dropped the mapping last, the event loop (240 ms on this machine's disk
once). What a crash leaves behind, the next daemon removes (``clean``). The daemon then holds one tensor
while it encodes and one slice while it streams; the copy's pages are the kernel's page cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import numpy as np

from p2pnode.wire.codec import iter_parts
from p2pnode.wire.mapped import MappedBody
from p2pnode.wire.payload import ModelSpec, Snapshot
from p2pnode.wire.public_file import PublicReader

_SERIAL = itertools.count()
#: what a snapshot file is named while it is written (an earlier daemon's are removed)
PATTERN = "served-*.part"


class ReleasingParts(list[memoryview]):
    """Parts (views of one mapping) with ``release``: what to call with each slice once written,
    so that its pages leave the resident set (``PartsResponse`` looks for it)."""

    def __init__(self, parts: list[memoryview], mapped: MappedBody) -> None:
        super().__init__(parts)
        self._mapped = mapped

    def release(self, view: memoryview) -> None:
        self._mapped.release(np.frombuffer(view, np.uint8))


class _Tensors(Mapping[str, np.ndarray]):
    """The worker's file's tensors, each read when looked up (``iter_parts`` looks up one at a time)."""

    def __init__(self, reader: PublicReader) -> None:
        self.reader = reader

    def __getitem__(self, name: str) -> np.ndarray:
        return self.reader.tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.reader.spec.names)

    def __len__(self) -> int:
        return len(self.reader.spec.names)


def clean(folder: Path) -> None:
    """Remove the snapshot files an earlier daemon left half written."""
    for old in folder.glob(PATTERN):
        old.unlink(missing_ok=True)


def write_snapshot(reader: PublicReader, spec: ModelSpec, node_id: str, epoch: str,
                   folder: Path) -> tuple[int, ReleasingParts, int, str] | None:
    """The worker's x̂, at whatever version its file is now, encoded as a snapshot into a file in
    ``folder``: (version, its parts, bytes, SHA-256), or None when a publish was under way or
    happened while it was read (try again). Blocking: called in a server thread."""
    seq, version, step, loss = reader.state()
    if seq & 1:
        return None
    header = spec.header("snapshot", node_id, epoch, version, base_version=-1, step=step, loss=loss)
    path = folder / f"served-{os.getpid()}-{next(_SERIAL)}.part"
    digest = hashlib.sha256()
    at = 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    mapped: MappedBody | None = None
    try:
        # a Mapping where Snapshot says dict: iter_parts only iterates it and looks tensors up
        for part in iter_parts(Snapshot(header, cast(dict[str, np.ndarray], _Tensors(reader)))):
            view = memoryview(part).cast("B")
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], at + done)
            digest.update(view)
            at += view.nbytes
        if reader.state()[0] != seq:
            return None
        mapped = MappedBody(fd=fd)
        mapped.remove_when_unmapped(str(path))
    finally:
        os.close(fd)
        if mapped is None:  # thrown away (this is a server thread: its blocks are freed here)
            with contextlib.suppress(OSError):
                os.unlink(path)
    return version, ReleasingParts([mapped.view], mapped), at, digest.hexdigest()
