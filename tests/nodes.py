"""Real ``p2pnode start`` processes on loopback for tests: start, query, signal, stop.

Imported as ``from nodes import ...`` (not from conftest: pytest loads several conftest
modules, and a bare ``import conftest`` would get whichever came first).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Fast settings for test clusters: a small synthetic task, frequent evaluation and checkpoints.
FAST = [
    "--data", "synthetic",
    "--set", "training.synthetic_samples=2048",
    "--set", "training.eval_every=25",
    "--set", "training.eval_samples=256",
    "--set", "training.lr=0.02",
    "--set", "checkpoint.interval=2",
    "--set", "exchange.timeout=1.0",
    "--set", "membership.gossip_interval=0.3",
    "--set", "membership.timeout=0.5",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(addr: str, path: str = "/v1/status", timeout: float = 2.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout) as resp:
        return json.load(resp)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_exc!r})")


class NodeProc:
    """One real daemon process; its stderr goes to a log file shown when a test fails."""

    def __init__(self, root: Path, name: str, seeds: list[str], extra: list[str], port: int | None = None) -> None:
        self.name = name
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.state_dir = root / name
        self.log_path = root / f"{name}.log"
        self.seeds = seeds
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> NodeProc:
        cmd = [sys.executable, "-m", "p2pnode", "start", "--listen", self.addr, "--state-dir", str(self.state_dir),
               *FAST, *self.extra]
        for seed in self.seeds:
            cmd += ["--seed", seed]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def status(self) -> dict[str, Any]:
        return get_json(self.addr)

    def wait_ready(self, timeout: float = 40.0) -> dict[str, Any]:
        return wait_for(lambda: (s := self.status())["training"]["worker_alive"] and s["joined"] and s,
                        timeout, f"{self.name} to be ready")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(12)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
