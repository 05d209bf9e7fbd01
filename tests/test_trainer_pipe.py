"""The supervisor's pipe to its worker when the worker goes away mid-conversation.

Deliveries in flight when the worker dies (a crash, or a stop during shutdown) must end in a
ConnectionError or a timeout that the exchange actor handles, never in an error from a pipe
closed under a write (CI once saw ``TypeError`` from ``write(None, ...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon_util import pid_alive
from p2pnode.config import Config
from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.daemon.supervisor import WorkerSupervisor

pytestmark = pytest.mark.slow

PAYLOAD = 4 << 20  # far more than a pipe holds: a write of it blocks until the worker reads


def small_config(state_dir: str) -> Config:
    """The torch-free worker (p2pnode/worker/stub.py): these tests are of the supervisor's side of
    the pipe, and the stub reads it as the torch worker does (``recv_bytes`` and the pipe
    protocol's ``decode``: an interleaved stream corrupts it too), answers a junk payload
    "malformed" as it does, and starts in a fraction of a second, not the seconds of torch's import."""
    cfg = Config()
    cfg.training.worker = "stub"
    cfg.node.state_dir = state_dir
    cfg.training.data = "synthetic"
    cfg.training.synthetic_samples = 512
    cfg.training.eval_every = 0
    cfg.checkpoint.interval = 0
    return cfg


@contextlib.asynccontextmanager
async def frozen_worker(state_dir: Path) -> AsyncIterator[tuple[WorkerSupervisor, int]]:
    """A running supervisor whose ready worker is frozen with SIGSTOP; yields it and the worker
    pid. Afterwards it is stopped (killing the worker if need be) and its actor awaited."""
    sup = WorkerSupervisor(small_config(str(state_dir)), "t" * 16, NodeMetrics())
    runner = asyncio.create_task(sup.run())
    try:
        await asyncio.wait_for(sup.clock.ready.wait(), 60)
        pid = sup.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        yield sup, pid
    finally:
        await sup.stop(checkpoint=False)
        await asyncio.wait_for(runner, 20)


@pytest.mark.timeout(90)
async def test_deliveries_in_flight_when_the_worker_dies_fail_cleanly(tmp_path) -> None:
    async with frozen_worker(tmp_path) as (sup, pid):
        # Frozen, the worker reads nothing: the first write blocks in the pipe, the others
        # queue behind it, and none can be answered; then it dies under them.
        junk = os.urandom(PAYLOAD)
        deliveries = [asyncio.create_task(sup.pipe.deliver("peer", junk, timeout=20)) for _ in range(12)]
        await asyncio.sleep(0.3)
        assert not any(d.done() for d in deliveries)
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.gather(*deliveries, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results), results
        # After the restart, deliveries work again.
        while sup.worker_pid == pid or not sup.state.worker_alive:
            await asyncio.sleep(0.1)
        reply = await sup.pipe.deliver("peer", b"not msgpack", timeout=20)
        assert not reply.ok and reply.reason == "malformed"
        assert sup.state.worker_restarts == 1


@pytest.mark.timeout(90)
async def test_stop_with_a_hung_worker_and_a_blocked_write_returns(tmp_path) -> None:
    """A frozen worker with a delivery stuck half-written in the pipe: stop() must still give
    up on its timeout and kill the worker, not wait behind the stuck write for ever."""
    async with frozen_worker(tmp_path) as (sup, pid):
        stuck = asyncio.create_task(sup.pipe.deliver("peer", os.urandom(PAYLOAD), timeout=600))
        await asyncio.sleep(0.3)
        assert not stuck.done()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(sup.stop(checkpoint=True, timeout=2.0), 30)
        assert asyncio.get_running_loop().time() - started < 10
        assert not pid_alive(pid)
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(stuck, 10)


@pytest.mark.timeout(90)
async def test_a_request_timing_out_mid_write_does_not_let_the_next_message_interleave(tmp_path) -> None:
    """A delivery whose timeout strikes while its bytes are still going into the pipe: the
    next message must wait for them, or the worker would read a corrupt stream."""
    async with frozen_worker(tmp_path) as (sup, pid):
        timed_out = asyncio.create_task(sup.pipe.deliver("peer", os.urandom(PAYLOAD), timeout=0.5))
        await asyncio.sleep(1.0)  # its timeout has struck; its write is still stuck in the pipe
        assert not timed_out.done()
        os.kill(pid, signal.SIGCONT)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(timed_out, 30)
        # The worker read the whole message and answers the next one: the stream is intact.
        reply = await sup.pipe.deliver("peer", b"not msgpack", timeout=20)
        assert not reply.ok and reply.reason == "malformed"
        assert sup.state.worker_restarts == 0


@pytest.mark.timeout(90)
async def test_a_worker_gone_as_it_says_hello_is_restarted_not_fatal(tmp_path) -> None:
    """A SIGTERM in a node's first second reaches its worker too; a worker gone just after its
    hello broke the pipe under the supervisor's answer (Begin), and the ConnectionError ended the
    whole node with exit 1 (tests/test_hostile_sigterm.py, seen once in a full run). The worker
    is killed here at that moment: the supervisor must restart it, and its actor go on."""
    sup = WorkerSupervisor(small_config(str(tmp_path)), "t" * 16, NodeMetrics())
    sup.begun = True  # the answer to a hello is then Begin, written into the pipe
    answer = sup._on_hello
    killed: list[int] = []

    async def on_hello_after_a_kill(msg):  # type: ignore[no-untyped-def]
        if not killed:
            pid = sup.worker_pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            while pid_alive(pid):
                await asyncio.sleep(0.02)
        await answer(msg)

    sup._on_hello = on_hello_after_a_kill  # type: ignore[method-assign]
    runner = asyncio.create_task(sup.run())
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while sup.state.worker_restarts < 1 or not sup.state.worker_alive:
            assert not runner.done(), runner.exception()
            assert asyncio.get_running_loop().time() < deadline, "the worker was not restarted"
            await asyncio.sleep(0.05)
        assert sup.worker_pid != killed[0]
    finally:
        await sup.stop(checkpoint=False)
        await asyncio.wait_for(runner, 20)
