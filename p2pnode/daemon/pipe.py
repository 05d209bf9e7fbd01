"""The pipe client: request/answer RPC with the current training worker over its pipe.

It knows messages, tokens and bytes, nothing of processes: the supervisor (``supervisor.py``)
attaches the pipe of each new worker and detaches it once that worker is gone. Writers are
serialised and a write is never abandoned half-way (the next message would interleave with its
bytes); a blocking reader thread hands every message to the event loop in order, and the
supervisor, the single consumer, routes answers back here by token (:meth:`answer`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from multiprocessing.connection import Connection

from p2pnode.daemon.metrics import NodeMetrics
from p2pnode.pipe_protocol import (
    AVERAGE,
    Applied,
    Checkpoint,
    Checkpointed,
    Hello,
    Message,
    PeerMode,
    PeerPayload,
    Request,
    receive,
    send,
)
from p2pnode.net.spool import SpooledBody
from p2pnode.priority import lower_this_thread
from p2pnode.wire.msgview import Body

log = logging.getLogger("p2pnode.pipe")


def checkpoint_timeout(params: int) -> float:
    """Seconds a checkpoint may take: 60, and a second more for every 5 MB the worker writes
    (about 12 bytes a parameter: the model, its optimizer state, the public copy), so that the
    periodic checkpoint of a big model never times out because of its size: the worker takes
    the request between two steps, after the big payloads queued before it (at 126M parameters
    on a loaded 2-core machine checkpoints took 3-25 s to write, and timed out at 105 s). Only
    the checkpointer waits on it, one checkpoint at a time."""
    return 60.0 + 12 * params / 5e6


#: the final checkpoint's budget at stop: this much for any model (the small CNN's whole stop
#: stays near the 10 s a service manager gives by default) ...
FINAL_FLOOR = 5.0
#: ... and a second more for every this many bytes the worker writes (about 12 a parameter),
#: a rate a loaded 2-core machine reaches (1.5 GB at 124M parameters took 3-25 s)
FINAL_RATE = 50e6


def final_checkpoint_timeout(params: int) -> float:
    """Seconds the final checkpoint at stop may take: FINAL_FLOOR, and more with the model's
    size (5.1 s for the small CNN, 35 s at 124M parameters, 89 s at 350M). A fixed 5 s left a
    100M model's final checkpoint "not written" on every stop."""
    return FINAL_FLOOR + 12 * params / FINAL_RATE


class WorkerPipe:
    """Send to and ask the worker; ``deliver`` and ``checkpoint`` are the two questions others ask."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self._tokens = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        self._inbox: asyncio.Queue[Message | None] = asyncio.Queue()
        self._send_lock = asyncio.Lock()
        #: the current worker's parameters (its hello says): what a checkpoint's deadline follows
        self.params = 0

    @property
    def attached(self) -> bool:
        return self._conn is not None

    # --- the worker's side of the conversation (used by the supervisor) --------------------

    def attach(self, conn: Connection) -> None:
        """Start talking to a new worker over ``conn`` (its end of a fresh pipe)."""
        self._conn = conn
        self._inbox = asyncio.Queue()
        self._reader = threading.Thread(target=self._read, args=(conn, self._inbox, asyncio.get_running_loop()),
                                        daemon=True, name="p2pnode-worker-pipe")
        self._reader.start()

    async def receive(self) -> Message | None:
        """The worker's next message, in order; None once its end of the pipe is closed."""
        return await self._inbox.get()

    def answer(self, msg: Applied | Checkpointed) -> None:
        """Hand an answer to whoever asked (nobody, if its request timed out)."""
        fut = self._pending.get(msg.token)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def fail_pending(self, exc: Exception) -> None:
        """The worker is gone: every question still waiting gets ``exc``."""
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)

    async def detach(self) -> None:
        """Close the pipe of a worker that has exited. Only then does a read or write still in
        progress end (EOF, EPIPE), so the descriptor is never closed under a thread using it."""
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join, 5.0)
            self._reader = None
        async with self._send_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _read(self, conn: Connection, inbox: asyncio.Queue[Message | None], loop: asyncio.AbstractEventLoop) -> None:
        """Blocking reads in a thread; every message is handed to the loop in order. The thread
        runs below the loop (a big model's messages are copied here: p2pnode/priority.py)."""
        lower_this_thread()
        while True:
            try:
                msg: Message | None = receive(conn)
            except (EOFError, OSError):
                msg = None
            except ValueError as exc:
                log.error("worker sent an undecodable message: %s", exc)
                continue
            if isinstance(msg, Hello):
                self.params = msg.params  # an int, written at once: read by the loop
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, msg)
            except RuntimeError:
                return  # the loop is closed
            if msg is None:
                return

    # --- questions ----------------------------------------------------------------------------

    def token(self) -> int:
        return next(self._tokens)

    async def send(self, msg: Message) -> None:
        # The lock serialises writers (big payloads: the pipe may block until the worker reads)
        # and keeps the pipe from being closed under a write in progress (see detach()).
        async with self._send_lock:
            conn = self._conn
            if conn is None:
                raise ConnectionError("no worker")
            write = asyncio.ensure_future(asyncio.to_thread(send, conn, msg))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # The thread writes on regardless; giving up the lock now would let the next
                # message interleave with this one's bytes. Hold it until the write ends (a
                # hung worker is killed by the supervisor's stop(), whose own wait times out).
                while not write.done():
                    try:
                        await asyncio.wait([write])
                    except asyncio.CancelledError:
                        continue  # the first cancellation is re-raised below
                if not write.cancelled():
                    write.exception()  # seen: the caller hears of the cancellation instead
                raise
            except (OSError, ValueError) as exc:
                raise ConnectionError(f"worker pipe: {exc!r}") from exc

    async def request(self, msg: Request, timeout: float) -> Message:
        """Send a message carrying a token and wait for the worker's answer to it."""
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[msg.token] = fut
        try:
            async with asyncio.timeout(timeout):  # waiting for the pipe counts too
                await self.send(msg)
                return await fut
        finally:
            self._pending.pop(msg.token, None)
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # failed while we were still sending: already reported by send

    async def deliver(self, peer: str, data: Body | SpooledBody, mode: PeerMode = AVERAGE, timeout: float = 30.0,
                      nth: int = 1, genesis: bool = False) -> Applied:
        """Hand a peer's payload to the worker (``nth``: its place among its round's payloads;
        ``genesis``: an answer to a fetch that named our version 0); its answer says whether it
        was taken in. A spooled body (net/spool.py) goes as its file's path, never through the
        pipe: the worker reads it from the file, so neither process holds it whole; the caller
        removes the file after. TimeoutError or ConnectionError: our worker is stuck, restarting
        or stopping."""
        if isinstance(data, SpooledBody):
            msg = PeerPayload(token=self.token(), peer=peer, data=b"", mode=mode, nth=nth, genesis=genesis,
                              path=str(data.path))
        else:
            msg = PeerPayload(token=self.token(), peer=peer, data=data, mode=mode, nth=nth, genesis=genesis)
        reply = await self.request(msg, timeout)
        if not isinstance(reply, Applied):
            raise ConnectionError(f"worker answered a payload with {reply.kind!r}")
        if not reply.ok:
            self.metrics.rejected.labels(reply.reason).inc()
        return reply

    async def checkpoint(self, timeout: float | None = None) -> Checkpointed:
        """Ask for a checkpoint; ``timeout`` by default follows the model's size."""
        if timeout is None:
            timeout = checkpoint_timeout(self.params)
        reply = await self.request(Checkpoint(token=self.token()), timeout)
        if not isinstance(reply, Checkpointed):
            raise ConnectionError(f"worker answered a checkpoint with {reply.kind!r}")
        return reply
