"""The life of a spawned training process, the same for every kind the daemon starts (the torch
worker, the stub, a parameter server's and a ps-worker's loop): torch-free, so the stub stays so.

The daemon decides when we stop (Ctrl-C, `timeout` and systemd may signal the whole process
group), so SIGINT and SIGTERM are ignored; if the daemon itself dies, the pipe closes and we exit
on EOF. A process that cannot be built says why in one ``Failed`` message. At the end every answer
is in the pipe and the final checkpoint is fsynced, so the interpreter's teardown is skipped: with
torch loaded it takes 1-3 s on a busy machine, all of it inside the daemon's 10 s stop budget
(and systemd's TimeoutStopSec).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Protocol

from p2pnode.pipe_protocol import Failed, encode


class Spawned(Protocol):
    def hello(self) -> None: ...

    def loop(self) -> None: ...


def run_spawned(conn: Connection, make: Callable[[], Spawned], failures: tuple[type[Exception], ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        process = make()
    except failures as exc:
        conn.send_bytes(encode(Failed(detail=str(exc))))
        return
    try:
        process.hello()
        process.loop()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the daemon is gone: nothing left to do
    logging.shutdown()
    os._exit(0)
