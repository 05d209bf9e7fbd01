"""The daemon's bulk threads (asyncio.to_thread) run below its event loop's priority."""

from __future__ import annotations

import asyncio
import os
import threading

from p2pnode.daemon import bulk_threads


def test_to_thread_work_runs_below_the_loop() -> None:
    async def main() -> tuple[int, int, str]:
        executor = bulk_threads.install(asyncio.get_running_loop())
        try:
            def nice_here() -> tuple[int, str]:
                return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), threading.current_thread().name
            loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            thread_nice, name = await asyncio.to_thread(nice_here)
            return loop_nice, thread_nice, name
        finally:
            executor.shutdown(wait=True)

    loop_nice, thread_nice, name = asyncio.run(main())
    assert thread_nice == min(19, loop_nice + bulk_threads.BULK_NICE)
    assert name.startswith("p2pnode-bulk")
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice  # the caller's own is unchanged


def test_the_unlinking_thread_runs_below_its_creator() -> None:
    from p2pnode.wire import unlink

    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    there = unlink._UNLINKER.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result(10)
    assert there >= min(19, here + bulk_threads.BULK_NICE)  # made by a bulk thread: lower still
