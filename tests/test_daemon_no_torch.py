"""The daemon moves bytes and never trains: configuration validation and every daemon module
must not import torch (it cost each start ~4 s and ~500 MB resident). Checked in a fresh
interpreter (this test process may have torch loaded already) and in a real running daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon_util import worker_pid
from nodes import STUB

PROBE = """
import sys
from p2pnode.config import Config, validate
cfg = Config()
cfg.compression.gradient = "qsgd:levels=8"
cfg.compression.publish = "ldte-bs:density=0.05"
cfg.training.model = "resnet18"
cfg.training.data = "synthetic"
validate(cfg)
import p2pnode.cli, p2pnode.daemon.node, p2pnode.compression, p2pnode.sync.actor
from p2pnode.compression import CompressionConfigError
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_validation_and_daemon_modules_import_no_torch() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_running_daemon_has_no_torch_mapped(cluster) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    maps = Path(f"/proc/{a.proc.pid}/maps").read_text()
    assert "libtorch" not in maps and "/torch/" not in maps


@pytest.mark.slow
def test_torch_stays_in_the_worker(cluster) -> None:
    """With the real trainer the worker maps libtorch and its daemon still does not."""
    a = cluster("a")
    a.wait_ready()
    assert "libtorch" in Path(f"/proc/{worker_pid(a.proc.pid)}/maps").read_text()
    assert "libtorch" not in Path(f"/proc/{a.proc.pid}/maps").read_text()
