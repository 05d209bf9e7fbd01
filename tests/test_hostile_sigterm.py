"""SIGTERM is a graceful stop from the first instant of ``p2pnode start``: the handler is
installed before the slow imports (the process catches SIGTERM before it listens), and a
SIGTERM at any moment of the start, before the node exists, while it binds and while its worker
starts, ends the process with exit code 0, never killed by the signal (-15)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nodes import STUB, NodeProc

SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & SIGTERM_BIT)
    return False


def listening(port: int) -> bool:
    """Whether any socket listens on ``port`` (from /proc/net/tcp: state 0A)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
            return True
    return False


def test_sigterm_the_moment_it_is_caught(cluster: Callable[..., NodeProc]) -> None:
    node = cluster("a", extra=[*STUB])
    deadline = time.monotonic() + 30
    while not catches_sigterm(node.pid):
        assert node.proc is not None and node.proc.poll() is None, "exited before catching SIGTERM"
        assert time.monotonic() < deadline, "never caught SIGTERM"
        time.sleep(0.005)
    was_listening = listening(node.port)
    maps = Path(f"/proc/{node.pid}/maps").read_text()
    node.signal(signal.SIGTERM)
    assert node.proc is not None
    assert node.proc.wait(10) == 0, node.log()[-3000:]
    assert not was_listening  # caught before the daemon had even bound its port
    assert "uvloop" not in maps  # and before the event loop (whose handlers came too late) was imported


@pytest.mark.parametrize("delay", [0.8, 1.6, 2.4, 3.2])
def test_sigterm_during_start_is_graceful(cluster: Callable[..., NodeProc], delay: float) -> None:
    node = cluster("a", extra=[*STUB])
    time.sleep(delay)
    node.signal(signal.SIGTERM)
    assert node.proc is not None
    assert node.proc.wait(10) == 0, node.log()[-3000:]
