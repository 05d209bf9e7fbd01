"""The daemon's threads for model-sized work run a little below its event loop's priority.

Everything big the daemon does leaves the event loop for a thread (``asyncio.to_thread``): a
served snapshot copied and hashed, a fetched body spooled and hashed, a merged delta encoded.
Those threads are busy for seconds at a time when the model is big, at the same priority as the
loop's own thread, so on a loaded machine the loop, waking for a ping or a health check, waited
behind them for a core: the longest stall of a 124M-parameter node on the 2-core machine was
476 ms, 358 ms of it ready to run but waiting for a core (the probe's split, daemon/looplag.py).
Here the default executor's threads are ``BULK_NICE`` nice steps below the loop (and above the
worker, ``WORKER_NICE`` below it): the loop's short bursts go first, the bulk work takes what is
left, and on an idle machine nothing changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("p2pnode.node")

#: how many nice steps below the event loop's thread the bulk threads run (the worker: 5)
BULK_NICE = 2
#: threads at most, as asyncio's own default executor has
MAX_WORKERS = min(32, (os.cpu_count() or 1) + 4)


def _lower_this_thread() -> None:
    """This thread ``BULK_NICE`` steps below its creator (a niceness is a thread's on Linux;
    raising one needs no privilege: a failure leaves the thread at the loop's priority)."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BULK_NICE))
    except OSError as exc:
        log.debug("bulk thread %d's priority left as it was: %s", tid, exc)


def install(loop: asyncio.AbstractEventLoop) -> ThreadPoolExecutor:
    """Make ``loop``'s default executor (``asyncio.to_thread``) one whose threads run below it."""
    executor = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="p2pnode-bulk",
                                  initializer=_lower_this_thread)
    loop.set_default_executor(executor)
    return executor
