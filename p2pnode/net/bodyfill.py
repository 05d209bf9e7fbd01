"""A big body read off a socket into one buffer, its bytes copied there in a thread.

The event loop hands over what the socket gave it, a batch of chunks at a time, and goes back
to reading: the copy (numpy's, which lets go of the GIL) and the first touch of the buffer's
fresh pages (page faults, and on a fragmented machine the kernel's compaction of huge pages)
happen beside the loop, not on it. Copied on the loop, a 500 MB snapshot held the GIL about
0.8 s in all (the largest single share of a daemon's GIL time at 124M parameters). One batch is
in flight while the next is read: at most ``2 x BATCH`` bytes are held besides the buffer.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from p2pnode.wire.msgview import big_buffer

#: bytes gathered on the loop before they are copied into the buffer in a thread
BATCH = 4 << 20


def _copy(dest: np.ndarray, at: int, chunks: list[bytes]) -> None:
    for chunk in chunks:
        n = len(chunk)
        dest[at:at + n] = np.frombuffer(chunk, np.uint8)
        at += n


class BatchedWriter:
    """Chunks handed over by the event loop, written in order by a thread a batch of ``BATCH``
    bytes at a time (``_write_batch``, at the batch's offset), one batch in flight while the next
    is gathered: a body kept in memory here, one spooled to a file in net/spool.py."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._at = 0
        self._flight: asyncio.Future[None] | None = None

    def _write_batch(self, at: int, chunks: list[bytes]) -> None:
        """Write ``chunks`` from offset ``at`` (in a thread)."""
        raise NotImplementedError

    async def add(self, chunk: bytes) -> None:
        """Take ``chunk`` (the caller checks that it fits); a batch goes to a thread once full."""
        self._pending.append(chunk)
        self._pending_bytes += len(chunk)
        if self._pending_bytes >= BATCH:
            await self._flush()

    async def _flush(self) -> None:
        if self._flight is not None:
            flight, self._flight = self._flight, None
            await flight
        if self._pending:
            chunks, at = self._pending, self._at
            self._at += self._pending_bytes
            self._pending, self._pending_bytes = [], 0
            self._flight = asyncio.ensure_future(asyncio.to_thread(self._write_batch, at, chunks))

    async def _drain(self) -> None:
        """Every chunk taken so far written."""
        await self._flush()
        if self._flight is not None:
            flight, self._flight = self._flight, None
            await flight


class BodyFill(BatchedWriter):
    """``size`` bytes to fill in order with :meth:`add`; :meth:`finish` waits for the last
    copy and returns the buffer (a memoryview of ``big_buffer``). :meth:`abandon` on failure."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.buffer = big_buffer(size)
        self._dest = np.frombuffer(self.buffer, np.uint8)

    @property
    def size(self) -> int:
        return self.buffer.nbytes

    def _write_batch(self, at: int, chunks: list[bytes]) -> None:
        _copy(self._dest, at, chunks)

    async def finish(self) -> memoryview:
        await self._drain()
        return self.buffer

    def abandon(self) -> None:
        """The read failed: a copy still in flight finishes into a buffer nobody reads."""
        if self._flight is not None:
            flight, self._flight = self._flight, None
            flight.add_done_callback(_quiet)
        self._pending = []


def _quiet(fut: asyncio.Future[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError, Exception):
        fut.result()
