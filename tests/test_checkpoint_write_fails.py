"""A checkpoint write that fails under torch.save (a full disk; here a real file-size limit in
a subprocess, so that the write itself fails with EFBIG) is an OSError, which the worker answers
as "not written" and trains on; the checkpoint before it stays whole and no temp file is left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import resource, signal, sys, torch
from pathlib import Path
from p2pnode import checkpoint
path = Path(sys.argv[1]) / "checkpoint.pt"
checkpoint.save(path, {"w": torch.zeros(10), "step": 1})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    checkpoint.save(path, {"w": torch.zeros(1 << 20), "step": 2})
except OSError as exc:
    print("OSError", exc)
"""


def test_a_failed_write_is_an_oserror_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("OSError checkpoint not written"), proc.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left
    import torch

    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["step"] == 1 and state["w"].numel() == 10
