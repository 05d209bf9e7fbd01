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


def _loops() -> list:
    import uvloop  # what the daemon runs on (cli.py)

    return [asyncio.new_event_loop, uvloop.new_event_loop]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_results_errors_and_cancellations_reach_the_loop_through_its_pipe() -> None:
    """What asyncio.to_thread gives back is the thread's result or its exception, as with
    asyncio's own executor; a future cancelled meanwhile is left cancelled; the pipe is closed
    when the loop shuts the executor down (asyncio.run's end)."""
    class Boom(Exception):
        pass

    def fail() -> None:
        raise Boom("from the thread")

    def stop_iteration() -> None:
        raise StopIteration

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()
        executor = bulk_threads.install(loop)
        assert isinstance(loop.run_in_executor(None, int), asyncio.Future)  # not a wrapped thread future
        out: list[object] = [await asyncio.to_thread(sum, range(10))]
        out += await asyncio.gather(*(asyncio.to_thread(pow, i, 2) for i in range(50)))
        try:
            await asyncio.to_thread(fail)
        except Boom as exc:
            out.append(str(exc))
        try:
            await asyncio.to_thread(stop_iteration)
        except RuntimeError as exc:
            out.append(type(exc).__name__)
        release = threading.Event()
        slow = asyncio.ensure_future(asyncio.to_thread(release.wait, 10))
        await asyncio.sleep(0.05)
        slow.cancel()
        release.set()
        await asyncio.sleep(0.2)  # its thread finishes and wakes the loop: nothing is set on the cancelled future
        out.append(slow.cancelled())
        # a thread of another kind submitting to the same executor gets a plain thread future
        out.append(await asyncio.to_thread(lambda: executor.submit(pow, 3, 3).result(5)))
        return out

    for new_loop in _loops():
        with asyncio.Runner(loop_factory=new_loop) as runner:  # uvloop keeps 2 descriptors of its own from its first loop on
            runner.run(asyncio.sleep(0))
        before = _open_fds()
        with asyncio.Runner(loop_factory=new_loop) as runner:
            out = runner.run(main())
        assert out == [45, *(i * i for i in range(50)), "from the thread", "RuntimeError", True, 27], new_loop
        assert _open_fds() == before, new_loop
