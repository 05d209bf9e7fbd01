"""Log output of both processes: the daemon's and the worker's lines in one of two formats.

``logging.format = "text"`` (default): one readable line per record, as always. ``"json"``: one
JSON object per line with the same schema from both processes, for journald/Loki/Elastic
pipelines that should not parse free text::

    {"ts": "2026-11-23T19:36:20.123Z", "level": "warning", "process": "daemon", "pid": 4242,
     "node": "3f2a9c0d1e4b5a67", "logger": "p2pnode.node", "msg": "...", "exc": "Traceback ..."}

``process`` is ``daemon`` or ``worker``; ``node`` is empty until the node id is known; ``exc``
only when the record carries an exception. stdlib only (the daemon stays torch-free).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

FORMATS = ("text", "json")
#: the keys of every JSON line, in order
SCHEMA = ("ts", "level", "process", "pid", "node", "logger", "msg")

_node = ""


def set_node(node_id: str) -> None:
    """Name this node in every later JSON line (the daemon learns its id after logging starts)."""
    global _node
    _node = node_id


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        ms = int(record.msecs)
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z",
            "level": record.levelname.lower(), "process": self.process, "pid": os.getpid(), "node": _node,
            "logger": record.name, "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def setup(level: str, fmt: str, process: str, text_format: str) -> None:
    """Configure the root logger of this process (stderr); later ``basicConfig`` calls are no-ops."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else logging.Formatter(text_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
