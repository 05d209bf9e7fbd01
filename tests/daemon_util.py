"""Small helpers for tests that talk to real daemons: raw HTTP (signed or not), metrics, processes."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from p2pnode.net.auth import sign


def http_request(addr: str, method: str, path_qs: str, body: bytes | Iterable[bytes] = b"",
                 headers: dict[str, str] | None = None, secret: bytes | None = None,
                 timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection; an iterable body goes out chunked (no Content-Length)."""
    host, _, port = addr.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    hdrs = dict(headers or {})
    if secret is not None:
        assert isinstance(body, bytes)
        hdrs.update(sign(secret, method, path_qs, body))
    try:
        if isinstance(body, bytes):
            conn.request(method, path_qs, body=body or None, headers=hdrs)
        else:
            conn.request(method, path_qs, body=body, headers=hdrs, encode_chunked=True)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def metrics_text(addr: str) -> str:
    status, _, body = http_request(addr, "GET", "/metrics")
    assert status == 200, status
    return body.decode()


def sample_value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample (0.0 when a labelled counter has not been touched yet)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                return float(s.value)
    return 0.0


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in task.read_text().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def worker_pid(daemon_pid: int, timeout: float = 10.0) -> int:
    """The training worker: the daemon's child started by multiprocessing's spawn (the other
    child, multiprocessing's resource tracker, is left alone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c for c in children(daemon_pid) if "spawn_main" in cmdline(c)]
        if len(found) == 1:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no single worker child of {daemon_pid}: {[cmdline(c) for c in children(daemon_pid)]}")


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
