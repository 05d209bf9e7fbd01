"""Big files are removed by one thread of their own, never by the event loop.

Removing a big file frees its pages and blocks, and this machine's file system (ext4 mounted
with ``discard``) tells the disk of every freed block before the call returns: 95 ms for a
500 MB file just written, and 240 ms once, measured on the daemon's event-loop thread, which
then answered nothing (its kernel stack: ``ext4_ext_truncate`` < ``blkdev_issue_discard`` <
``submit_bio_wait``). The blocks are freed by whatever drops the file's last reference: the
unlink of a closed file, or the last ``close``/``munmap`` of an unlinked one; so a file mapped
for as long as it is used is removed only once it is unmapped (:func:`remove_when_unmapped`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from p2pnode.priority import lower_this_thread

_UNLINKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="p2pnode-unlink", initializer=lower_this_thread)


def _quietly(op: Callable[[Any], object], arg: Any) -> None:
    with contextlib.suppress(OSError):
        op(arg)


def _in_thread(op: Callable[[Any], object], arg: Any) -> None:
    """``op(arg)`` in the unlinking thread (at once, where that thread is gone: at exit), an
    OSError ignored (the file is gone already)."""
    try:
        _UNLINKER.submit(_quietly, op, arg)
    except RuntimeError:
        _quietly(op, arg)


def remove(path: str) -> None:
    """Remove ``path`` in the unlinking thread."""
    _in_thread(os.unlink, path)


def close(fd: int) -> None:
    """Close ``fd`` in the unlinking thread: it may hold the last reference to a file removed
    meanwhile (a worker's x̂ file that a restarted worker replaced), whose blocks go then."""
    _in_thread(os.close, fd)


def remove_when_unmapped(mapping: mmap.mmap, path: str) -> weakref.finalize:
    """Remove ``path`` in the unlinking thread once ``mapping`` (of it) is gone. Unmapping a file
    that still has its name frees nothing, so the thread that lets the mapping go (the event
    loop, when it drops an answer streamed from it) does no file system work. The mapping's own
    ``close`` and unmap run before its weak references are cleared, so the unlink comes after."""
    return weakref.finalize(mapping, remove, path)
