"""Atomic checkpoint files: temp file, fsync, rename, fsync the folder.

A crash at any instant leaves either the previous checkpoint or the new one, never a torn
file. Loading uses ``weights_only=True``: a checkpoint is data, never code; one that cannot be
loaded is set aside (``checkpoint.pt.invalid-<time>``) with one log line.

torch is imported only where a checkpoint is saved or loaded (in the worker): the daemon writes
its small files with :func:`write_atomic` and never pays torch's import for it.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

CHECKPOINT_NAME = "checkpoint.pt"
_SERIAL = itertools.count()

log = logging.getLogger("p2pnode.checkpoint")


class CheckpointError(RuntimeError):
    pass


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_beside(path: Path) -> Path:
    """A temp file's name beside ``path``, its own to each call: two writers of one file (two
    threads of one process: the daemon saves members.json from its member loop and at each
    checkpoint) never rename each other's temp file away."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}-{next(_SERIAL)}")


def _replace_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Temp file beside ``path``, ``write`` into it, fsync, rename over ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write small files (node id, incarnation) with the same guarantee as checkpoints."""
    _replace_with(path, lambda fh: fh.write(data))


def write_parts(path: Path, parts: Iterable[bytes | memoryview]) -> None:
    """Write a file of ``parts`` in turn (a big model's tensors as they lie in memory, never
    joined into one copy), with the same guarantee as checkpoints."""
    def write(fh: BinaryIO) -> None:
        for part in parts:
            fh.write(part)

    _replace_with(path, write)


def save(path: Path, state: dict[str, Any]) -> None:
    """torch.save into a temp file renamed over ``path``. A write that fails under torch's zip
    writer (a full disk) comes out of torch.save as a RuntimeError ("unexpected pos"); it is
    raised as an OSError, so that the worker answers "not written" and trains on, where it
    exited (a 350M run on a full disk) and was restarted from the last checkpoint."""
    import torch

    def write(fh: BinaryIO) -> None:
        try:
            torch.save(state, fh)
        except RuntimeError as exc:
            raise OSError(f"checkpoint not written: {exc}") from exc

    _replace_with(path, write)


def set_aside(path: Path, why: object, then: str, logger: logging.Logger = log) -> Path:
    """Rename a bad state file out of the way (``NAME.invalid-<time>``, never over an earlier
    one), say so in one log line, and return where it went."""
    stem = f"{path.name}.invalid-{time.strftime('%Y%m%dT%H%M%S')}"
    aside = path.with_name(stem)
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{stem}-{n}")
    os.replace(path, aside)
    logger.warning("%s is invalid (%s): set aside as %s; %s", path, why, aside.name, then)
    return aside


def _short(exc: BaseException) -> str:
    """The first line of torch's refusal, without its advice: torch suggests weights_only=False,
    which would run whatever code the file carries."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if "weights_only" in first or not first:
        first = "not a tensors-only file"
    return f"{type(exc).__name__}: {first[:200]}"


def load(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or None if there is none. A file that cannot be read as a
    p2pnode checkpoint (torn, foreign, or carrying code) is set aside with one log line and
    None is returned: the node starts afresh (from a live peer's model when it has one) instead
    of failing every restart on the same file."""
    if not path.exists():
        return None
    import torch

    then = "starting without it"
    try:
        with warnings.catch_warnings():  # torch's multi-line remarks about foreign pickles: the log line says it
            warnings.simplefilter("ignore")
            # mmap: a big model's tensors are read from the file as they are copied into the
            # model, not loaded whole beside it first
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        set_aside(path, _short(exc), then)
        return None
    if not isinstance(state, dict) or "model" not in state:
        set_aside(path, "not a p2pnode checkpoint", then)
        return None
    return state
