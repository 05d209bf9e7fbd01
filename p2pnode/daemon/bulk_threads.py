"""The daemon's threads for model-sized work run a little below its event loop's priority.

Everything big the daemon does leaves the event loop for a thread (``asyncio.to_thread``): a
served snapshot copied and hashed, a fetched body spooled and hashed, a merged delta encoded.
Those threads are busy for seconds at a time when the model is big, at the same priority as the
loop's own thread, so on a loaded machine the loop, waking for a ping or a health check, waited
behind them for a core: the longest stall of a 124M-parameter node on the 2-core machine was
476 ms, 358 ms of it ready to run but waiting for a core (the probe's split, daemon/looplag.py).
Here the default executor's threads are ``BULK_NICE`` nice steps below the loop (and above the
worker, ``WORKER_NICE`` below it): the loop's short bursts go first, the bulk work takes what is
left, and on an idle machine nothing changes. The worker pipe's reader and the unlinking thread
(wire/unlink.py) lower themselves the same way (p2pnode/priority.py).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from p2pnode.priority import BULK_NICE, lower_this_thread

__all__ = ["BULK_NICE", "install"]

def install(loop: asyncio.AbstractEventLoop) -> ThreadPoolExecutor:
    """Make ``loop``'s default executor (``asyncio.to_thread``) one whose threads run below it."""
    # as many threads at most as asyncio's own default executor (ThreadPoolExecutor's default)
    executor = ThreadPoolExecutor(thread_name_prefix="p2pnode-bulk", initializer=lower_this_thread)
    loop.set_default_executor(executor)
    return executor
