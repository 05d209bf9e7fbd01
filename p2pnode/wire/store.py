"""Where a replica's (or the worker's genesis's) flat float32 arrays live: in memory, or in one
file read and written a tensor at a time (wire/replica.py says when which).

A file store keeps no tensor in memory between two uses: a lookup reads that tensor into a
fresh array (``pread``), an update writes one back (``pwrite``). The process's memory then holds
at most the tensors in use at once (one, in averaging and in applying a delta), whatever the
model's size and however many replicas there are. The file is removed when the store is closed
or garbage-collected. The pages go through the kernel's page cache: a replica read right after
it was written comes from memory the kernel may reclaim, not from the disk.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from p2pnode.wire.payload import ModelSpec


class ArrayStore(Mapping[str, np.ndarray]):
    """Flat float32 arrays by tensor name. ``store[name]`` is for reading (a memory store
    returns its own array: do not write to it); ``for_update(name)`` is an array that may be
    changed and then given back with ``write``."""

    def write(self, name: str, values: np.ndarray) -> None:
        raise NotImplementedError

    def for_update(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the store holds (a file store removes its file)."""


class MemoryStore(ArrayStore):
    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def write(self, name: str, values: np.ndarray) -> None:
        if self._arrays.get(name) is not values:
            self._arrays[name] = np.array(values, dtype=np.float32, copy=True).reshape(-1)

    def for_update(self, name: str) -> np.ndarray:
        return self._arrays[name]  # updated in place: write() then keeps it


def _unlink(path: str, fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass


class FileStore(ArrayStore):
    """The tensors of ``spec`` back to back in one file at ``path`` (created, sized, removed on
    close). A tensor not written yet is not there (``in`` says False)."""

    def __init__(self, path: Path, spec: ModelSpec) -> None:
        self.path = path
        self._where: dict[str, tuple[int, int]] = {}
        at = 0
        for t in spec.tensors:
            self._where[t.name] = (at, t.numel)
            at += 4 * t.numel
        self._written: set[str] = set()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._closer = weakref.finalize(self, _unlink, str(path), self._fd)
        os.ftruncate(self._fd, at)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._written:
            raise KeyError(name)
        offset, numel = self._where[name]
        out = np.empty(numel, dtype=np.float32)
        view = out.data.cast("B")
        done = 0
        while done < view.nbytes:
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise OSError(f"replica file {self.path} ended early")
            done += n
        return out

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._where if name in self._written)

    def __len__(self) -> int:
        return len(self._written)

    def __contains__(self, name: object) -> bool:
        return name in self._written

    def write(self, name: str, values: np.ndarray) -> None:
        offset, numel = self._where[name]
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if values.size != numel:
            raise ValueError(f"{name}: {values.size} values for a tensor of {numel}")
        view = values.data.cast("B")
        done = 0
        while done < view.nbytes:
            done += os.pwritev(self._fd, [view[done:]], offset + done)
        self._written.add(name)

    def for_update(self, name: str) -> np.ndarray:
        return self[name]

    def close(self) -> None:
        self._closer()


def stash(folder: Path, name: str, spec: ModelSpec, arrays: Mapping[str, np.ndarray]) -> FileStore:
    """``arrays`` (a whole model's flat float32 values, e.g. the worker's genesis) written to a
    file store ``folder/name`` that is read back a tensor at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    store = FileStore(folder / name, spec)
    for t in spec.tensors:
        store.write(t.name, np.asarray(arrays[t.name]))
    return store
