"""systemd's notify protocol: one datagram to $NOTIFY_SOCKET per state change.

READY=1 once listening and joined, WATCHDOG=1 from the event loop (so a stuck loop gets the
unit restarted), STOPPING=1 on shutdown. Without $NOTIFY_SOCKET every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket


def notify(state: str) -> bool:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(path)
            sock.sendall(state.encode())
        except OSError:
            return False
    return True


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd asked for, in seconds, or None when there is none."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return max(0.1, int(usec) / 2e6)
    except ValueError:
        return None


async def watchdog_loop() -> None:
    """An actor that pets the watchdog while the event loop turns."""
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
