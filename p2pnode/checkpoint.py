"""Atomic checkpoint files: temp file, fsync, rename, fsync the folder.

A crash at any instant leaves either the previous checkpoint or the new one, never a torn
file. Loading uses ``weights_only=True``: a checkpoint is data, never code.

torch is imported only where a checkpoint is saved or loaded (in the worker): the daemon writes
its small files with :func:`write_atomic` and never pays torch's import for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(RuntimeError):
    pass


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write small files (node id, incarnation) with the same guarantee as checkpoints."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def save(path: Path, state: dict[str, Any]) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def load(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None if there is none; CheckpointError if unreadable."""
    if not path.exists():
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {path} is not a p2pnode checkpoint")
    return state
