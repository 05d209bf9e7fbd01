"""systemd: the unit file verifies and says what it must, and a real daemon speaks the notify
protocol (READY=1 once listening and joined, WATCHDOG=1 in time, STOPPING=1 on SIGTERM)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2pnode.cli import _start_parser, build_config
from nodes import STUB
from p2pnode.daemon import notify

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "p2pnode.service"


def unit_lines() -> list[str]:
    return UNIT.read_text().splitlines()


def directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit_lines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


# --- the unit file ----------------------------------------------------------------------

def test_unit_says_what_the_daemon_needs() -> None:
    d = directives()
    one = {k: v[-1] for k, v in d.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["WatchdogSec"] == "30" and one["Restart"] == "on-failure"
    assert one["KillMode"] == "mixed" and one["TimeoutStopSec"] == "20"
    assert one["StateDirectory"] == "p2pnode" and one["DynamicUser"] == "yes"
    assert one["RestartPreventExitStatus"] == "2"  # config errors (exit 2) are not retried
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
                       "ProtectKernelModules": "yes", "ProtectControlGroups": "yes", "LockPersonality": "yes",
                       "SystemCallArchitectures": "native"}.items():
        assert one.get(key) == value, key
    # the event loop's thread (alone) may take the lowest real-time priority, and no higher
    assert one["RestrictRealtime"] == "no" and one["LimitRTPRIO"] == "1"
    assert set(one["RestrictAddressFamilies"].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert "MemoryDenyWriteExecute" not in d  # torch's JIT kernels need W^X memory; see the comment
    # The data cache points into CacheDirectory= (the rest of the file system is read-only).
    assert one["CacheDirectory"] == "p2pnode" and "XDG_CACHE_HOME=%C/p2pnode" in d["Environment"]
    argv = shlex.split(one["ExecStart"])
    assert argv[:4] == ["/usr/local/bin/p2pnode", "start", "--config", "/etc/p2pnode/node.toml"]
    assert argv[4:] == ["--state-dir", "${STATE_DIRECTORY}"]


def test_unit_exec_start_is_a_command_line_the_cli_accepts(tmp_path: Path) -> None:
    """The options ExecStart passes exist and combine with the shipped example config."""
    argv = shlex.split(directives()["ExecStart"][-1])[1:]
    argv = [str(ROOT / "conf" / "node.toml") if a == "/etc/p2pnode/node.toml" else a for a in argv]
    argv = [str(tmp_path) if a == "${STATE_DIRECTORY}" else a for a in argv]
    parser = argparse.ArgumentParser()
    _start_parser(parser.add_subparsers(dest="command"))
    cfg = build_config(parser.parse_args(argv))
    assert cfg.node.state_dir == str(tmp_path)


def test_every_directive_says_why() -> None:
    """Each directive has a comment right above it (or shares one with the directives next to it)."""
    previous = ""
    for n, line in enumerate(unit_lines(), 1):
        if line and not line.startswith(("#", "[")):
            assert previous.startswith("#"), f"line {n}: {line!r} has no comment above it"
        previous = line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "p2pnode"
    assert exe.exists(), exe
    unit = tmp_path / "p2pnode.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/p2pnode", str(exe)))
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not run.stdout.strip() and not run.stderr.strip(), run.stdout + run.stderr
    # ... and it can fail: a typo in a directive is reported.
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=mixd"))
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "mixd" in run.stdout + run.stderr


# --- p2pnode.daemon.notify --------------------------------------------------------------

@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    folder = tempfile.mkdtemp(prefix="p2pn-", dir="/tmp")  # short: AF_UNIX paths are < 108 bytes
    path = os.path.join(folder, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_notify_sends_one_datagram(notify_socket, monkeypatch) -> None:
    sock, path = notify_socket
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False  # not under systemd: a no-op
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    assert notify.notify("READY=1\nSTATUS=hello")
    sock.settimeout(2)
    assert sock.recv(4096) == b"READY=1\nSTATUS=hello"
    monkeypatch.setenv("NOTIFY_SOCKET", path + ".gone")
    assert notify.notify("WATCHDOG=1") is False  # systemd gone: never an exception


def test_notify_abstract_socket(monkeypatch) -> None:
    name = f"p2pnode-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.notify("STOPPING=1")
        assert sock.recv(100) == b"STOPPING=1"


def test_watchdog_interval(monkeypatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert notify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert notify.watchdog_interval() == 15.0  # half the timeout
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert notify.watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert notify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert notify.watchdog_interval() is None


# --- a real daemon ----------------------------------------------------------------------

def receive(sock: socket.socket, until: float) -> list[tuple[float, str]]:
    out = []
    while (left := until - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            break
        out.append((time.monotonic(), data.decode()))
    return out


@pytest.mark.timeout(90)
def test_daemon_speaks_the_notify_protocol(cluster, notify_socket, monkeypatch) -> None:
    sock, path = notify_socket
    a = cluster("a", extra=STUB)
    a_id = a.wait_ready()["node_id"]
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # 2 s: pings expected every second
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    b = cluster("b", seeds=[a.addr], extra=STUB)
    monkeypatch.delenv("NOTIFY_SOCKET")
    monkeypatch.delenv("WATCHDOG_USEC")

    # Until READY=1 only watchdog pings may come; right after it, b answers and has joined.
    seen: list[tuple[float, str]] = []
    deadline = time.monotonic() + 60
    ready = None
    while ready is None and time.monotonic() < deadline:
        seen += receive(sock, min(deadline, time.monotonic() + 0.2))
        ready = next(((at, msg) for at, msg in seen if "READY=1" in msg.splitlines()), None)
        assert b.proc.poll() is None, b.log()[-3000:]
    assert ready is not None, f"no READY=1 in 60 s; got {seen}"
    s = b.status()
    assert s["joined"] and s["training"]["worker_alive"]
    assert any(m["node_id"] == a_id and m["state"] == "alive" for m in s["members"]), s["members"]
    assert re.search(r"^STATUS=.*serving on " + re.escape(b.addr), ready[1], re.M), ready[1]
    early = [msg for at, msg in seen if at < ready[0]]
    assert early and all(msg == "WATCHDOG=1" for msg in early), early

    # WATCHDOG=1 keeps coming, more often than WATCHDOG_USEC (2 s), training or not.
    later = seen[seen.index(ready) + 1:] + receive(sock, time.monotonic() + 4.5)
    assert all(msg == "WATCHDOG=1" for _, msg in later), later
    pings = [at for at, msg in seen if msg == "WATCHDOG=1" and at < ready[0]] + [at for at, _ in later]
    recent = [t for t in pings if t >= ready[0] - 2.0]
    assert len(recent) >= 4, later
    gaps = [b2 - b1 for b1, b2 in zip(pings, pings[1:])]
    assert max(gaps) < 2.0, f"watchdog gaps {gaps}"

    # SIGTERM: STOPPING=1 first, then a clean exit.
    b.signal(signal.SIGTERM)
    after: list[str] = []
    deadline = time.monotonic() + 10
    while "STOPPING=1" not in after and time.monotonic() < deadline:
        after += [msg for _, msg in receive(sock, min(deadline, time.monotonic() + 0.2))]
    assert "STOPPING=1" in after, f"no STOPPING=1 after SIGTERM: {after}"
    assert b.proc.wait(10) == 0
