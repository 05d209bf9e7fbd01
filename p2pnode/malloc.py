"""glibc's allocator told to hand freed blocks back to the system (the daemon; a big model's worker).

Why: glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at first) with a
mapping of its own and unmaps it when it is freed. But that threshold is dynamic: each free of
such a block raises it to the block's size, up to 32 MiB. After one 25 MB delta has come and
gone, every later block under 25 MB (a delta's index array, a merged delta, a 4 MiB spool
batch, a chunk of a stream) is carved from the heap or from a thread's arena, and what is
freed there mostly stays in the process, fragmented. Measured at 124M parameters, 4 nodes on
loopback (``scripts/bench_model_size.py --sizes 124M --links loopback --window 60``, the
resident sets sampled every 0.2 s): the daemons grew to 290-715 MB of anonymous memory over
four minutes and kept it; with the threshold fixed at 1 MiB they stayed at 37-100 MB between
transfers (peaks 208-264 MB).

Setting the threshold with ``mallopt`` turns the dynamic rule off (for the trim threshold
too). A block of 1 MiB or more then costs a mapping and its page faults, a few milliseconds
for the biggest; the model-sized ones are few per exchange.

A user's own ``MALLOC_MMAP_THRESHOLD_`` (glibc's environment variable) wins; other C
libraries (musl, macOS) are left as they are. The worker is started with a threshold of its
own, 64 MiB (daemon/supervisor.py ``WORKER_MALLOC_ENV``: a small model's step buffers stay
mapped from one step to the next), so a worker of a big model hands back what its model-sized
work freed with :func:`release_free_memory` instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

log = logging.getLogger("p2pnode.node")

#: blocks of this size or more are mapped on their own and unmapped when freed
MMAP_THRESHOLD = 1 << 20
#: mallopt's parameter number for it (malloc.h)
M_MMAP_THRESHOLD = -3


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """This process's glibc, once (``platform.libc_ver`` reads the interpreter's file); None
    under another C library."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError as exc:
        log.debug("glibc not loaded: %s", exc)
        return None


def return_big_frees(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; True if it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        log.debug("allocator: MALLOC_MMAP_THRESHOLD_ set in the environment, left to it")
        return False
    libc = _glibc()
    if libc is None:
        return False
    try:
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold)))
    except AttributeError as exc:
        log.debug("allocator left as it was: %s", exc)
        return False
    if not ok:
        log.debug("allocator: mallopt refused a threshold of %d bytes", threshold)
    return ok


#: a model of this many float32 bytes or more: its worker hands back freed memory after each
#: publish, peer's payload and checkpoint (below it, the freed step buffers would only be faulted
#: back in at the next step; at 64 MiB and over the model's own tensors are mapped apart anyway)
RELEASE_MODEL_BYTES = 64 << 20

def release_free_memory() -> bool:
    """glibc's ``malloc_trim(0)``: the free pages of the heap and of every arena back to the
    system, the heap's top and the holes between blocks still in use alike; True if any was.

    Why: the worker runs with a 64 MiB mmap threshold and a 256 MiB trim threshold, so the
    buffers of a big model's publish (the selection's indices and values, the encoded body), a
    peer's payload and a checkpoint are carved from the heap and stay resident once freed.
    Measured at 124M parameters (4 nodes, loopback): workers held 2.1-2.2 GB of anonymous
    memory where torch, the model, its gradient and momentum are 1.8 GB. A call costs a walk of
    the free lists, milliseconds beside the seconds that work takes."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.malloc_trim(ctypes.c_size_t(0)))
    except AttributeError:
        return False
