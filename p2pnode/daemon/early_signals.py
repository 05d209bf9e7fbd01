"""SIGTERM and SIGINT caught from the first instant of ``p2pnode start``.

Python's default SIGTERM kills the process on the spot, and importing the daemon (aiohttp,
numpy, the worker machinery) takes a second or more before the event loop installs its own
handlers. ``install()`` runs first thing in ``p2pnode start`` and only notes the request; the
node checks :func:`requested` before it binds anything and exits 0 without starting, and once
its loop runs, the loop's handlers take over (graceful leave and final checkpoint).
"""

from __future__ import annotations

import signal
from types import FrameType

_requested: int | None = None


def _note(signum: int, frame: FrameType | None) -> None:
    global _requested
    _requested = signum


def install() -> None:
    """Catch SIGTERM and SIGINT from now on; they only set a flag until the loop replaces them."""
    signal.signal(signal.SIGTERM, _note)
    signal.signal(signal.SIGINT, _note)


def requested() -> int | None:
    """The signal that asked us to stop before the loop's handlers were installed, if any."""
    return _requested
