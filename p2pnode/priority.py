"""CPU priority for the threads of a node that do bulk work beside its event loop.

On Linux a niceness is a thread's, and a thread made later inherits its creator's. Lowering
one's own needs no privilege, and a failure only leaves the thread where it was. Why the
daemon lowers its bulk threads: daemon/bulk_threads.py; why the worker runs lower still:
daemon/supervisor.py ``WORKER_NICE``.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("p2pnode.node")

#: how many nice steps below the event loop's thread the daemon's bulk threads run (the worker: 5)
BULK_NICE = 2


def lower_this_thread(steps: int = BULK_NICE) -> None:
    """The calling thread ``steps`` nice steps lower than it is (at most 19)."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError as exc:
        log.debug("thread %d's priority left as it was: %s", tid, exc)
