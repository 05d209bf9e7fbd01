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


#: the real-time priority the event loop's thread takes (1: the lowest; above every normal
#: thread, below every kernel or system real-time thread)
LOOP_RT_PRIORITY = 1


def realtime_loop_thread() -> bool:
    """Put the calling thread (the event loop's) in the kernel's round-robin real-time class.

    Why: a thread of the normal class that wakes for a ping waits for a core behind every
    runnable normal thread of the machine, whatever their niceness. On the 2-core machine four
    124M-parameter nodes stalled their loops up to 375 ms that way while their workers wrote
    checkpoints (the kernel's writeback threads are normal threads too). A real-time thread
    takes a core as it wakes. Its work is short by design (model-sized work goes to threads,
    p2pnode/daemon/bulk_threads.py), and the kernel keeps 5 % of each second for normal threads
    whatever a real-time one does (``sched_rt_runtime_us``).

    ``SCHED_RESET_ON_FORK``: the threads and processes this thread starts (the bulk threads, the
    worker) are normal ones. Needs root, CAP_SYS_NICE or an ``RLIMIT_RTPRIO`` of 1; without it
    the thread stays as it was and False is returned.
    """
    policy = getattr(os, "SCHED_RR", None)
    if policy is None:  # not Linux
        return False
    try:
        os.sched_setscheduler(threading.get_native_id(), policy | os.SCHED_RESET_ON_FORK,
                              os.sched_param(LOOP_RT_PRIORITY))
    except (OSError, AttributeError) as exc:
        log.debug("event loop left in the normal scheduling class: %s", exc)
        return False
    return True
