"""The daemon's side of a worker's pipe, for tests that run a worker in this process."""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import TypeVar

from p2pnode.pipe_protocol import Message, receive

M = TypeVar("M", bound=Message)


def drain(conn: Connection, kind: type[M]) -> tuple[list[M], threading.Thread]:
    """Read ``conn`` in a thread until it closes, keeping the messages of ``kind`` (the list
    fills as they come): a worker's published models fill the pipe otherwise, and it blocks.
    Join the thread once the worker's end is closed."""
    kept: list[M] = []

    def read() -> None:
        try:
            while True:
                msg = receive(conn)  # a big message's fields follow it as raw frames
                if isinstance(msg, kind):
                    kept.append(msg)
        except (EOFError, OSError):
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return kept, reader
