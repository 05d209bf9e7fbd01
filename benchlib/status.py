"""Talking to a running node from outside: its JSON status, a free port, waiting on a condition."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def get_json(addr: str, path: str = "/v1/status", timeout: float = 2.0, token: str = "") -> dict[str, Any]:
    """GET ``http://ADDR/PATH`` as JSON; raises OSError (URLError, timeouts) when it does not answer.
    ``token``: the read-only credential a node with a cluster secret asks for (the secret itself
    or its dashboard token), sent as a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(f"http://{addr}{path}", headers=headers), timeout=timeout) as resp:
        data: dict[str, Any] = json.load(resp)
        return data


def fetch_status(addr: str, timeout: float = 2.0, token: str = "") -> dict[str, Any] | None:
    """A node's ``/v1/status``, or None while it is starting, stopped or gone (for polling loops)."""
    try:
        return get_json(addr, "/v1/status", timeout, token)
    except (OSError, ValueError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the kernel's pick; another process may take it later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_for(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll ``pred`` until it returns something true, and return that; errors a node gives
    while it starts (refused connections, a key not there yet) count as "not yet". Raises
    AssertionError naming ``what`` and the last error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_exc!r})")
        time.sleep(interval)


def samples(addr: str, timeout: float = 5.0) -> int:
    """Training samples a node has processed so far (its status)."""
    return int(get_json(addr, timeout=timeout)["training"]["samples"])


def sample_edge(addr: str, limit: float = 5.0, poll: float = 0.01) -> tuple[float, int]:
    """The moment node ``addr``'s sample counter changes (to within a poll) and its new value:
    rates measured between two such edges do not depend on where in a step they start."""
    first = samples(addr)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        now = samples(addr)
        if now != first:
            return time.monotonic(), now
        time.sleep(poll)
    return time.monotonic(), samples(addr)
