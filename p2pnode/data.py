"""Training and test data, read offline.

Fashion-MNIST comes from the Debian package ``dataset-fashion-mnist`` (gzipped IDX files in
``/usr/share/datasets/fashion-mnist``) or any folder holding the same four files, gzipped or
not. They are unpacked once into ``<cache>/fashion-mnist-<key>/FashionMNIST/raw/`` so
torchvision's reader takes them with ``download=False``: nothing is ever fetched from the network.
The key names the source (its path and its files' sizes and times), so a node pointed at another
folder never trains on files unpacked from an earlier one. CIFAR-10 is read by
torchvision from a folder the user already has. ``synthetic`` is a small learnable set for tests.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

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
    """Unpack the IDX files where torchvision looks; returns the torchvision ``root``."""
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


def fashion_mnist(train: bool, source: Path | None = None, cache: Path | None = None) -> Split:
    """Fashion-MNIST as normalised tensors, through torchvision's reader, offline."""
    from torchvision.datasets import FashionMNIST

    root = prepare_fashion_mnist(source, cache)
    ds = FashionMNIST(str(root), train=train, download=False)
    images = ds.data.unsqueeze(1).float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)
    return Split(images.contiguous(), ds.targets.long().clone())


def cifar10(train: bool, root: Path) -> Split:
    """CIFAR-10 from a folder the user has (torchvision layout); never downloads."""
    from torchvision.datasets import CIFAR10

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
