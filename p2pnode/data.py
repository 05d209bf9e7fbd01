"""Training and test data, read offline.

Fashion-MNIST comes from the Debian package ``dataset-fashion-mnist`` (gzipped IDX files in
``/usr/share/datasets/fashion-mnist``) or any folder holding the same four files, gzipped or
not. They are unpacked once into ``<cache>/fashion-mnist-<key>/FashionMNIST/raw/`` (torchvision's
layout, so caches written before stay valid) and read from there with numpy: the IDX format is
a header and raw bytes, and reading it here keeps torchvision (the ``vision`` extra) off a node
that trains the built-in CNN, with the very tensors torchvision's reader gave. Nothing is ever
fetched from the network. The key names the source (its path and its files' sizes and times),
so a node pointed at another folder never trains on files unpacked from an earlier one.
CIFAR-10 is read by torchvision from a folder the user already has. ``synthetic`` is a small
learnable set for tests.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from p2pnode import extras

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# Per-channel mean and std of Fashion-MNIST's training images.
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class DataError(RuntimeError):
    """The named data set is not where it was said to be."""


@dataclass(frozen=True)
class Split:
    """Tensors held in memory: small enough for every data set we support."""

    images: torch.Tensor  # float32, N x C x H x W, normalised
    labels: torch.Tensor  # int64, N

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def dataset(self) -> TensorDataset:
        return TensorDataset(self.images, self.labels)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "p2pnode" / "data"


def _find_fashion_source(source: Path | None) -> Path:
    candidates = [source] if source else [DEBIAN_FASHION_MNIST]
    for folder in candidates:
        if folder is None:
            continue
        for sub in (folder, folder / "FashionMNIST" / "raw"):
            if all((sub / f).exists() or (sub / f"{f}.gz").exists() for f in FASHION_FILES):
                return sub
    hint = f"{source}" if source else f"{DEBIAN_FASHION_MNIST} (apt-get install dataset-fashion-mnist)"
    raise DataError(f"Fashion-MNIST files not found in {hint}")


def source_key(src: Path) -> str:
    """A short digest of where the files come from and what they are (size, mtime): the cache
    entry of one source is never read for another, and a changed file is unpacked again."""
    h = hashlib.sha256(str(src.resolve()).encode())
    for name in FASHION_FILES:
        for path in (src / name, src / f"{name}.gz"):
            if path.exists():
                st = path.stat()
                h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def prepare_fashion_mnist(source: Path | None = None, cache: Path | None = None) -> Path:
    """Unpack the IDX files into the source's cache entry; returns its root (the files are in
    ``ROOT/FashionMNIST/raw/``, where torchvision's reader would look)."""
    src = _find_fashion_source(source)
    root = (cache or default_cache_dir()) / f"fashion-mnist-{source_key(src)}"
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in FASHION_FILES:
        target = raw / name
        if target.exists():
            continue
        tmp = raw / f".{name}.tmp{os.getpid()}"
        plain, packed = src / name, src / f"{name}.gz"
        with (open(plain, "rb") if plain.exists() else gzip.open(packed, "rb")) as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout)
            fout.flush()
            os.fsync(fout.fileno())
        os.replace(tmp, target)
    return root


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An unsigned-byte IDX array (the MNIST format: 0, 0, type 0x08, ``ndim``, then ``ndim``
    big-endian 32-bit sizes, then the bytes); raises DataError naming the file when it is not
    one of ``ndim`` dimensions whose size matches its header."""
    with open(path, "rb") as f:
        head = f.read(4 + 4 * ndim)
        if len(head) < 4 or head[:3] != b"\0\0\x08" or head[3] != ndim or len(head) < 4 + 4 * ndim:
            raise DataError(f"{path}: not an unsigned-byte IDX file of {ndim} dimension(s)")
        shape = tuple(int(d) for d in np.frombuffer(head, dtype=">u4", offset=4))
        body = np.fromfile(f, dtype=np.uint8)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path}: {body.size} bytes of data, its header says {'x'.join(map(str, shape))}")
    return body.reshape(shape)


def fashion_mnist_raw(train: bool, source: Path | None = None,
                      cache: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST as the files hold it, offline: uint8 images N x 28 x 28 and their labels,
    checked to match (DataError if they do not)."""
    raw = prepare_fashion_mnist(source, cache) / "FashionMNIST" / "raw"
    prefix = "train" if train else "t10k"
    pixels = read_idx(raw / f"{prefix}-images-idx3-ubyte", 3)
    labels = read_idx(raw / f"{prefix}-labels-idx1-ubyte", 1)
    if pixels.shape[1:] != (28, 28) or pixels.shape[0] != labels.shape[0]:
        raise DataError(f"{raw}: {prefix} images of shape {pixels.shape} do not match {labels.shape[0]} labels "
                        "of 28x28 images")
    if labels.size and int(labels.max()) >= 10:
        raise DataError(f"{raw}: {prefix} label {int(labels.max())} is not one of Fashion-MNIST's 10 classes")
    return pixels, labels


def fashion_mnist(train: bool, source: Path | None = None, cache: Path | None = None) -> Split:
    """Fashion-MNIST as normalised tensors, offline: uint8 images scaled to [0, 1] and
    normalised by the training set's mean and std, float32 N x 1 x 28 x 28, int64 labels, in
    the files' order (what torchvision's ``FashionMNIST`` reader gave; tests/test_cpu_only.py)."""
    pixels, labels = fashion_mnist_raw(train, source, cache)
    images = torch.from_numpy(pixels).unsqueeze(1).float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)
    return Split(images.contiguous(), torch.from_numpy(labels).long())


def cifar10(train: bool, root: Path) -> Split:
    """CIFAR-10 from a folder the user has (torchvision layout, read by torchvision: the
    ``vision`` extra); never downloads."""
    CIFAR10 = extras.torchvision("training.data = cifar10", DataError).datasets.CIFAR10
    try:
        ds = CIFAR10(str(root), train=train, download=False)
    except RuntimeError as exc:
        raise DataError(f"CIFAR-10 not found under {root}: {exc}") from exc
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return Split(((images - mean) / std).contiguous(), torch.tensor(ds.targets, dtype=torch.long))


def synthetic(n: int, seed: int = 0, shape: tuple[int, int, int] = (1, 28, 28), classes: int = 10) -> Split:
    """A learnable toy set: each class is a fixed random pattern plus noise.

    The same ``seed`` gives the same class patterns on every node, so nodes with different
    ``n``/shards still learn one task together.
    """
    gen = torch.Generator().manual_seed(1234)
    patterns = torch.randn(classes, *shape, generator=gen)
    gen.manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=gen)
    images = 0.35 * patterns[labels] + torch.randn(n, *shape, generator=gen)
    return Split(images, labels)


def shard(split: Split, index: int, count: int, partition: str = "iid", seed: int = 0) -> Split:
    """The ``index``-th of ``count`` disjoint shards under a partition (p2pnode.partition):
    ``iid`` interleaved equal shards, ``dirichlet:alpha=A`` label skew, ``classes:k=K``."""
    from p2pnode import partition as parts

    try:
        idx = parts.shard_indices(split.labels.numpy(), parts.parse(partition), index, count, seed)
    except parts.PartitionError as exc:
        raise DataError(f"training.partition: {exc}") from None
    chosen = torch.from_numpy(idx)
    return Split(split.images[chosen].contiguous(), split.labels[chosen].contiguous())
