"""Fashion-MNIST with a shorter test set, for tests of whole clusters that train for seconds.

A node evaluates its final model on the *whole* test set (the product's final figure), and a
test then evaluates every node's checkpoint again: with 10 000 test images that was most of a
short run's CPU time (tests/test_poisoned_peer.py: about 5 s per evaluation, 8 per cluster).
``fashion_mnist_short_test(n)`` is a data folder (``--data-dir``, ``training.data_dir``) with the
same training files and the test set's first ``n`` images (class-balanced within a few per
cent: the test file is shuffled), so those evaluations cost n/10 000 of it. Every node and the
test's own evaluation read the same n images: comparisons between runs stay paired.

The folder is kept under the data cache (``p2pnode.data.default_cache_dir``), named by the
source's cache entry and ``n``, so it is written once per machine (atomically: built aside,
then renamed) and the nodes' unpacked cache of it is reused by every later run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from p2pnode.data import (
    FASHION_FILES,
    default_cache_dir,
    fashion_mnist_raw,
    prepare_fashion_mnist,
    read_idx,
)


def write_idx(path: Path, array: np.ndarray) -> None:
    """``array`` (uint8) as an unsigned-byte IDX file (the header ``read_idx`` checks)."""
    head = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    path.write_bytes(head + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def atomic_dir(target: Path, write: Callable[[Path], Any]) -> Path:
    """``write(tmp)`` then rename to ``target`` (once per machine: an existing one is kept, and
    of two processes making it at once the first rename wins)."""
    if target.is_dir():
        return target
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


def fashion_mnist_short_test(n: int, source: Path | None = None, cache: Path | None = None) -> Path:
    """A Fashion-MNIST folder: the training files of ``source`` (default: the Debian package)
    linked, the first ``n`` test images and labels written; its path."""
    if n <= 0:
        raise ValueError(f"n must be positive, not {n}")
    base = cache or default_cache_dir()
    entry = prepare_fashion_mnist(source, base)  # the source's own unpacked files, named by its key
    raw = entry / "FashionMNIST" / "raw"
    folder = base / f"{entry.name}-test{n}"

    def write(tmp: Path) -> None:
        for name in FASHION_FILES[:2]:  # training images and labels: the source's own files
            (tmp / name).symlink_to((raw / name).resolve())
        write_idx(tmp / FASHION_FILES[2], read_idx(raw / FASHION_FILES[2], 3)[:n])
        write_idx(tmp / FASHION_FILES[3], read_idx(raw / FASHION_FILES[3], 1)[:n])

    return atomic_dir(folder, write)


COLOURS = {"red": (200, 40, 40), "green": (40, 180, 60), "blue": (50, 60, 210)}


def write_image_folders(root: Path, train: int, val: int) -> Path:
    """``root/{train,val}/{red,green,blue}/NNN.png``: noise with a coloured square somewhere
    (an ImageFolder tree for ``training.task = "imagefolder"``: tests/test_tasks_cluster.py,
    scripts/bench_batchnorm.py)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        for name, rgb in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                img = rng.normal(128, 60, (32, 32, 3))
                y, x = rng.integers(0, 20, 2)
                img[y:y + 12, x:x + 12] = np.array(rgb) + rng.normal(0, 25, (12, 12, 3))
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"{i:03d}.png")
    return root


def write_fashion_folders(root: Path, train: int, val: int) -> Path:
    """``root/{train,val}/{0..9}/NNNN.png``: the first ``train`` (``val``) Fashion-MNIST images
    of each class from its training (test) set, as an ImageFolder tree: real images for
    ``training.task = "imagefolder"`` (scripts/bench_batchnorm.py --data fashion)."""
    from PIL import Image

    for split, is_train, n in (("train", True, train), ("val", False, val)):
        pixels, labels = fashion_mnist_raw(is_train)
        for c in range(10):
            folder = root / split / str(c)
            folder.mkdir(parents=True)
            for i, at in enumerate(np.flatnonzero(labels == c)[:n]):
                Image.fromarray(pixels[at]).convert("RGB").save(folder / f"{i:04d}.png")
    return root
