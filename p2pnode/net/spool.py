"""A big fetched body written to a file as it arrives, never held whole in the daemon's memory.

A model answer of ``SPOOL_FROM`` bytes or more (a big model's snapshot, a whole publish) is
spooled: the event loop hands what the socket gave it to a thread a batch at a time (as
net/bodyfill.py does for a body kept in memory), and the thread writes the batch at its place in
a scratch file and feeds it to the body's SHA-256 (what the answer's signature is checked
against, so the body is never read back for that). The daemon then holds at most two batches of
the body, whatever its size; the worker maps the file and applies it to its replica a tensor at
a time (wire/mapped.py), so neither process holds the body whole.

The file is named ``N.part`` while it is written and renamed ``N.body`` once complete: a
``.body`` file is always a whole body as received. It is scratch, not state: no fsync (a body
is used once, within seconds, and never after a restart, when the folder is emptied). The
:class:`SpooledBody` that names it owns it: ``close()`` removes it, and so does the garbage
collector if nobody closed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import weakref
from pathlib import Path

from p2pnode.net.bodyfill import BatchedWriter
from p2pnode.wire.unlink import remove as _remove

#: bodies of this many bytes or more are spooled to a file when the fetch gives a folder: the
#: size from which a worker keeps its replicas in files (wire/replica.py DISK_FROM)
SPOOL_FROM = 64 * 1024 * 1024
_SERIAL = itertools.count()



class SpooledBody:
    """A whole body in a file (``path``, ``nbytes`` long; ``sha256``: its hex digest). Its owner
    closes it (the file is removed) once the worker has answered; the worker reads it by path."""

    def __init__(self, path: Path, nbytes: int, sha256: str) -> None:
        self.path = path
        self.nbytes = nbytes
        self.sha256 = sha256
        self._closer = weakref.finalize(self, _remove, str(path))

    def __len__(self) -> int:
        return self.nbytes

    def close(self) -> None:
        """Remove the file (in a thread: the caller may be the event loop)."""
        self._closer()

    def read_all(self) -> bytes:
        """The whole body in memory (tests, and a small tool; never the daemon's data path)."""
        return self.path.read_bytes()


#: the folder of a node's state dir that its daemon spools big bodies to
SPOOL_DIR = "spool"


class Spool:
    """The folder spooled bodies go to (made, and emptied of what an earlier daemon left, when
    this is made: at the daemon's start, before it serves anything, where before it was made on
    its first use, by the event loop while it served: a ``mkdir`` there once waited 267 ms for
    the disk) and the size from which a body goes there."""

    def __init__(self, folder: Path, spool_from: int = SPOOL_FROM) -> None:
        self.folder = folder
        self.spool_from = spool_from
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in itertools.chain(self.folder.glob("*.part"), self.folder.glob("*.body")):
            _remove(str(old))

    def wants(self, declared: int | None) -> bool:
        """Whether a body of ``declared`` bytes goes to a file (only a declared length: a body
        of unknown length is read under the limit in memory, as before)."""
        return declared is not None and declared >= self.spool_from

    def fill(self, size: int) -> SpoolFill:
        return SpoolFill(self.folder, size)


def _write(fd: int, at: int, chunks: list[bytes], digest: hashlib._Hash) -> None:
    """One batch written at ``at`` and hashed (in a thread: both let go of the GIL)."""
    for chunk in chunks:
        view = memoryview(chunk)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done)
        digest.update(chunk)
        at += len(view)


class SpoolFill(BatchedWriter):
    """``size`` bytes to write in order with :meth:`add` (the caller checks that they fit);
    :meth:`finish` waits for the last write and returns the :class:`SpooledBody`; :meth:`abandon`
    on failure (the partial file is removed). One batch is in flight while the next is read."""

    def __init__(self, folder: Path, size: int) -> None:
        super().__init__()
        n = next(_SERIAL)
        self.size = size
        self._part = folder / f"{os.getpid()}-{n}.part"
        self._done = folder / f"{os.getpid()}-{n}.body"
        self._fd = os.open(self._part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._closer = weakref.finalize(self, _close_and_remove, self._fd, str(self._part))
        self._digest = hashlib.sha256()

    def _write_batch(self, at: int, chunks: list[bytes]) -> None:
        _write(self._fd, at, chunks, self._digest)

    async def finish(self) -> SpooledBody:
        await self._drain()
        if self._at != self.size:
            raise ValueError(f"spooled {self._at} bytes of {self.size}")
        os.close(self._fd)
        self._closer.detach()
        os.replace(self._part, self._done)  # the whole body, under its final name
        return SpooledBody(self._done, self.size, self._digest.hexdigest())

    def abandon(self) -> None:
        """The read failed: a write still in flight ends into a file that is then removed."""
        self._pending = []
        if self._flight is not None:
            flight, self._flight = self._flight, None
            closer = self._closer
            flight.add_done_callback(lambda f: _quiet_then(f, closer))
        else:
            self._closer()


def _close_and_remove(fd: int, path: str) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
    _remove(path)


def _quiet_then(fut: asyncio.Future[None], closer: weakref.finalize) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        fut.result()
    closer()
