"""The training journal: a bounded on-disk history of this node's training, JSON lines.

Every ``logging.history_interval`` seconds the daemon appends one line to
``STATE_DIR/history.jsonl``: time, step, samples, loss, step size, test accuracy and loss (with
the step they were measured at), non-finite losses, worker restarts, exchanges and model bytes,
live members. The dashboard's history (dashboard/history.py) holds the last 10 minutes in memory;
this keeps the whole run across restarts, for reports and post-mortems. Bounded: when the file
passes ``logging.history_max_bytes`` it becomes ``history.jsonl.1`` (replacing the previous
one) and a new file starts, so the two never hold more than twice the bound. A line is written
whole with one ``write``; a torn last line (power loss) is skipped by :func:`read`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("p2pnode.journal")

JOURNAL_NAME = "history.jsonl"


def _num(v: Any) -> Any:
    """NaN and infinities are not JSON: null."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def record(status: dict[str, Any]) -> dict[str, Any]:
    """One journal line from a ``/v1/status`` document."""
    t, ex, b = status["training"], status["exchanges"], status["bytes"]
    return {
        "ts": round(time.time(), 3), "node": status["node_id"], "step": t["step"], "samples": t["samples"],
        "loss": _num(t["loss"]), "lr": _num(t["lr"]), "accuracy": _num(t["accuracy"]),
        "test_loss": _num(t["test_loss"]), "eval_step": t["eval_step"], "nonfinite": t["nonfinite"],
        "done": t["done"], "worker_restarts": t["worker_restarts"], "epoch": t["epoch"],
        "exchanges_done": ex["done"], "exchanges_skipped": ex["skipped"],
        "bytes_received": b["model_received"], "bytes_served": b["model_served"],
        "members_alive": sum(1 for m in status["members"] if m["state"] == "alive"),
    }


class Journal:
    def __init__(self, state_dir: Path, max_bytes: int) -> None:
        self.path = state_dir / JOURNAL_NAME
        self.max_bytes = max_bytes

    def append(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n").encode()
        try:
            if self.path.stat().st_size + len(data) > self.max_bytes:
                os.replace(self.path, self.path.with_name(JOURNAL_NAME + ".1"))
        except FileNotFoundError:
            pass
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def read(state_dir: Path) -> list[dict[str, Any]]:
    """Every journal line, oldest first (the rotated file, then the current one); lines that do
    not parse (a torn last line) are skipped."""
    out = []
    for path in (state_dir / (JOURNAL_NAME + ".1"), state_dir / JOURNAL_NAME):
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
    return out


async def run(status: Callable[[], dict[str, Any]], state_dir: Path, interval: float, max_bytes: int) -> None:
    """Append a line every ``interval`` seconds (0: never) until cancelled, and a last one then."""
    if interval <= 0:
        return
    journal = Journal(state_dir, max_bytes)

    def line() -> dict[str, Any] | None:
        try:
            return record(status())
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("training journal %s: %s", journal.path, exc)
            return None

    def write(doc: dict[str, Any] | None) -> None:
        if doc is None:
            return
        try:
            journal.append(doc)
        except (OSError, TypeError, ValueError) as exc:  # never stop the node for its journal
            log.warning("training journal %s: %s", journal.path, exc)

    try:
        while True:
            await asyncio.sleep(interval)
            # the status on the loop (it reads the actors' state), the file in a thread: its open
            # and write wait for the state folder, where the worker replaces a checkpoint of
            # gigabytes (a big model's) and the disk frees the old one's blocks
            await asyncio.to_thread(write, line())
    except asyncio.CancelledError:
        write(line())  # the last line at the stop, where the loop has nothing left to answer
        raise
