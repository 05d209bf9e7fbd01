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

A thread that finished tells the loop so without holding the interpreter lock. asyncio's own
executor does it from the thread with ``call_soon_threadsafe``, whose write to the loop's wake-up
descriptor is made with the lock held: the loop, woken by that write, takes the thread's core
(the kernel lets a woken thread of higher priority run first) and then sleeps on the lock the
thread still holds, until that thread, now lower than the trainers, gets a core again. Sampled
at 124M parameters on the 2-core machine (py-spy, GIL holders), the bulk threads held the lock
at that very line for runs of up to 250 ms, and the loops' stalls were waits on a futex (the
lock): 70-750 ms. Here the thread appends its result to a queue and writes one byte to a pipe
with ``os.write``, which lets go of the lock before the system call; the loop, woken, finds the
lock free, and sets the awaiting future from the queue.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from p2pnode.priority import BULK_NICE, lower_this_thread

__all__ = ["BULK_NICE", "BulkExecutor", "install"]


class BulkExecutor(ThreadPoolExecutor):
    """A thread pool whose work, submitted from the loop's thread (``run_in_executor``,
    ``asyncio.to_thread``), returns an asyncio future the loop sets itself once woken through a
    pipe; submitted from any other thread, it is a plain ThreadPoolExecutor."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # as many threads at most as asyncio's own default executor (ThreadPoolExecutor's default)
        super().__init__(thread_name_prefix="p2pnode-bulk", initializer=lower_this_thread)
        self._loop = loop
        self._loop_thread = threading.get_ident()
        #: finished work: (its future, its exception or None, its result); appended by the
        #: threads, emptied by the loop
        self._finished: collections.deque[tuple[asyncio.Future[Any], BaseException | None, Any]] = \
            collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        loop.add_reader(self._wake_r, self._deliver)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != self._loop_thread or self._loop.is_closed():
            return super().submit(fn, *args, **kwargs)
        future: asyncio.Future[Any] = self._loop.create_future()
        super().submit(self._run, future, fn, args, kwargs)
        return future  # asyncio.wrap_future (run_in_executor) hands an asyncio future back as it is

    def _run(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as asyncio's own executor does
            result, error = None, exc
        if isinstance(error, StopIteration):  # an asyncio future refuses it (it would end a generator)
            error = RuntimeError(f"StopIteration raised by {fn!r}")
        self._finished.append((future, error, result))
        try:
            os.write(self._wake_w, b"\0")  # the lock is let go before the write (see the module's text)
        except BlockingIOError:
            pass  # the pipe is full of wake-ups the loop has not read yet: it will see this one too
        except OSError:
            pass  # closed: the loop is gone, and nobody awaits

    def _deliver(self) -> None:
        """On the loop: read the wake-ups, then set every finished future (a cancelled one is left)."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while self._finished:
            future, error, result = self._finished.popleft()
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def _close_pipe(self) -> None:
        """On the loop (or once it is closed): stop reading the pipe, set what finished, close it."""
        if self._wake_r < 0:
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(self._wake_r)
            self._deliver()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_r = self._wake_w = -1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if not wait:
            return  # work may still finish and write its wake-up: the pipe stays open
        if threading.get_ident() == self._loop_thread:
            self._close_pipe()
        else:  # asyncio.run's shutdown_default_executor calls this from a thread of its own
            try:
                self._loop.call_soon_threadsafe(self._close_pipe)
            except RuntimeError:  # the loop is closed: nothing reads the pipe any more
                self._close_pipe()


def install(loop: asyncio.AbstractEventLoop) -> BulkExecutor:
    """Make ``loop``'s default executor (``asyncio.to_thread``) one whose threads run below it
    and wake it without the interpreter lock held. Call it on the loop's thread."""
    executor = BulkExecutor(loop)
    loop.set_default_executor(executor)
    return executor
