"""A payload read from the file the daemon spooled it to (net/spool.py), a tensor at a time.

The worker maps the file read-only and decodes it as it would bytes off the pipe (the codec's
values are views of the mapping, wire/msgview.py), but each part, once checked or applied, is
let go (``release``: ``madvise(MADV_DONTNEED)`` on its pages): the pages stay in the kernel's
page cache, and leave this process's resident set, so that a 500 MB snapshot costs the worker
about one tensor of resident memory at a time, not the whole body. A part looked at again (the
apply after the check) is read back from the page cache.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator

import numpy as np

from p2pnode.wire.msgview import Body
from p2pnode.wire.unlink import remove, remove_when_unmapped

#: what a decoder calls with an array (a view of the body, or anything else: ignored then) it
#: has finished with
Release = Callable[[np.ndarray], None]


class MappedBody:
    """The file at ``path`` mapped read-only: ``view`` its bytes, ``release(array)`` drops the
    pages under a view of them from the resident set. Close it (a context manager) when done."""

    def __init__(self, path: str = "", fd: int = -1) -> None:
        """The file at ``path``, or the one open as ``fd`` (left open)."""
        own = fd < 0
        if own:
            fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        finally:
            if own:
                os.close(fd)
        self.size = size
        self.view = memoryview(self._mm) if self._mm is not None else memoryview(b"")
        self._base = np.frombuffer(self.view, np.uint8).ctypes.data if size else 0

    def release(self, array: np.ndarray) -> None:
        if self._mm is None or array.nbytes == 0:
            return
        start = array.__array_interface__["data"][0] - self._base
        end = start + array.nbytes
        if start < 0 or end > self.size:
            return  # not a view of this body (a decoded copy)
        start -= start % mmap.PAGESIZE
        self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def remove_when_unmapped(self, path: str) -> None:
        """Remove the file at ``path`` (this mapping's) once the mapping is gone, in the
        unlinking thread (wire/unlink.py), whichever thread lets the mapping go."""
        if self._mm is not None:
            remove_when_unmapped(self._mm, path)
        else:
            remove(path)

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # views still alive: unmapped when they go
            self.view.release()
            if self._mm is not None:
                self._mm.close()

    def __enter__(self) -> MappedBody:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def peer_body(data: Body, path: str) -> Iterator[tuple[Body, Release | None]]:
    """A peer payload's bytes and what releases its parts: ``data`` as it came through the pipe,
    or, with ``path`` (``PeerPayload.path``), the spooled file mapped. OSError when that file
    cannot be read (our daemon's doing, not the peer's: it gave up waiting and removed it)."""
    if not path:
        yield data, None
        return
    with MappedBody(path) as body:
        yield body.view, body.release
