"""A model answer streamed from the parts it lies in: never joined into one copy, never copied
whole on the event loop.

A cached snapshot is its msgpack header and each tensor's values as they lie in memory
(wire/served.py). ``PartsResponse`` sends them a slice at a time, each write waiting for the
socket to drain and then letting the loop run its other callbacks (aiohttp's drain returns
at once while the socket takes everything, so a fast reader on loopback could take a whole
snapshot in one unbroken stretch of the kernel's copies on the loop), with ``Content-Length``
set (the receiver reads into one buffer of that size) and the body's SHA-256 computed
beforehand, off the loop, so that the signature middleware can sign the answer before its
headers go out (net/server.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence

from aiohttp import web

#: bytes handed to the transport at a time: each write waits until the socket has taken them
SLICE = 1 << 20

Part = bytes | bytearray | memoryview


def sha256_of(parts: Sequence[Part]) -> str:
    """The SHA-256 (hex) of the parts in turn; hashlib releases the GIL on big buffers, so this
    runs in a thread beside the event loop."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def total(parts: Sequence[Part]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


class PartsResponse(web.StreamResponse):
    """An answer whose body is ``parts``, written in slices once aiohttp has sent its headers;
    ``body_sha256()`` gives their SHA-256 (blocking: called in a thread, and only to sign)."""

    def __init__(self, parts: Sequence[Part], body_sha256: Callable[[], str], *, status: int = 200,
                 headers: dict[str, str] | None = None, content_type: str = "application/octet-stream") -> None:
        super().__init__(status=status, headers=headers)
        self.content_type = content_type
        #: parts that say how (a ``release`` method: wire/served_file.py) let go of each slice's
        #: pages once it is written, so a body mapped from a file is never resident whole
        self.release: Callable[[memoryview], None] | None = getattr(parts, "release", None)
        self.parts = list(parts)
        self.body_sha256 = body_sha256
        self.nbytes = total(self.parts)
        self.content_length = self.nbytes
        self.sent = 0

    async def write_eof(self, data: bytes = b"") -> None:
        if self.prepared and not self._eof_sent:
            for part in self.parts:
                view = memoryview(part).cast("B")
                for at in range(0, view.nbytes, SLICE):
                    await self.write(view[at:at + SLICE])
                    self.sent += min(SLICE, view.nbytes - at)
                    if self.release is not None:
                        self.release(view[at:at + SLICE])
                    await asyncio.sleep(0)
        await super().write_eof(data)
