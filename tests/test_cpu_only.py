"""A CPU-only node: torchvision is the ``vision`` extra, and there is no CPU build of
it on PyPI, so the default task (the small CNN on Fashion-MNIST) must train with PyTorch alone.
Checked in a fresh interpreter where ``import torchvision`` fails: the built-in task builds, reads
Fashion-MNIST, trains a step and evaluates, and never imports torchvision; what does need it says
so in one line naming the extra. The numpy IDX reader gives the very tensors torchvision's
reader gave (where torchvision is installed), so accuracy figures stay comparable."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from p2pnode.data import (
    DEBIAN_FASHION_MNIST,
    FASHION_MEAN,
    FASHION_STD,
    DataError,
    fashion_mnist,
    prepare_fashion_mnist,
)


def write_idx(folder: Path, n: int, seed: int, packed: bool = True) -> None:
    """Four small Fashion-MNIST IDX files of random pixels and labels (gzipped as the Debian
    package ships them, or raw)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix in ("train", "t10k"):
        images = struct.pack(">IIII", 0x803, n, 28, 28) + rng.integers(0, 256, n * 28 * 28, dtype=np.uint8).tobytes()
        labels = struct.pack(">II", 0x801, n) + rng.integers(0, 10, n, dtype=np.uint8).tobytes()
        for name, body in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            if packed:
                (folder / f"{name}.gz").write_bytes(gzip.compress(body))
            else:
                (folder / name).write_bytes(body)


def torchvision_split(root: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What data.fashion_mnist returned when it read through torchvision (its code before)."""
    datasets = pytest.importorskip("torchvision.datasets")
    ds = datasets.FashionMNIST(str(root), train=train, download=False)
    images = ds.data.unsqueeze(1).float().div_(255.0).sub_(FASHION_MEAN).div_(FASHION_STD)
    return images.contiguous(), ds.targets.long().clone()


@pytest.mark.parametrize("packed", [True, False])
def test_the_idx_reader_gives_torchvisions_tensors(tmp_path: Path, packed: bool) -> None:
    write_idx(tmp_path / "src", 300, seed=5, packed=packed)
    cache = tmp_path / "cache"
    for train in (True, False):
        split = fashion_mnist(train, tmp_path / "src", cache)
        images, labels = torchvision_split(prepare_fashion_mnist(tmp_path / "src", cache), train)
        assert split.images.dtype == torch.float32 and split.labels.dtype == torch.int64
        assert split.images.shape == (300, 1, 28, 28) and split.images.is_contiguous()
        assert torch.equal(split.images, images) and torch.equal(split.labels, labels)


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_the_real_fashion_mnist_is_read_as_torchvision_read_it(tmp_path: Path) -> None:
    for train, n in ((True, 60000), (False, 10000)):
        split = fashion_mnist(train, None, tmp_path)
        images, labels = torchvision_split(prepare_fashion_mnist(None, tmp_path), train)
        assert len(split) == n
        assert torch.equal(split.images, images) and torch.equal(split.labels, labels)


def test_a_broken_idx_file_is_named_in_one_line(tmp_path: Path) -> None:
    write_idx(tmp_path / "short", 20, seed=1, packed=False)
    path = tmp_path / "short" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: 15675 bytes of data, its header says 20x28x28"):
        fashion_mnist(True, tmp_path / "short", tmp_path / "cache")
    write_idx(tmp_path / "magic", 20, seed=1, packed=False)
    (tmp_path / "magic" / "t10k-labels-idx1-ubyte").write_bytes(b"PK\x03\x04 not an idx file")
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte: not an unsigned-byte IDX file of 1 dimension"):
        fashion_mnist(False, tmp_path / "magic", tmp_path / "cache")
    write_idx(tmp_path / "labels", 20, seed=1, packed=False)
    (tmp_path / "labels" / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 20) + bytes([12] * 20))
    with pytest.raises(DataError, match="label 12 is not one of Fashion-MNIST's 10 classes"):
        fashion_mnist(True, tmp_path / "labels", tmp_path / "cache")


# A fresh interpreter in which torchvision cannot be imported, as on a node installed with
# PyTorch's CPU wheel and without the vision extra.
WITHOUT_TORCHVISION = """
import importlib.abc, json, sys

class NoTorchvision(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorchvision())
data_dir = sys.argv[1]
from p2pnode.config import Config
from p2pnode.data import DataError, cifar10
from p2pnode.models import build_model
from p2pnode.tasks.probe import probe
from p2pnode.worker.training import ShardTrainer

def cfg(**training):
    base = {"device": "cpu", "data": "fashion-mnist", "data_dir": data_dir, "warmup_samples": 0,
            "batch_size": 32, "shard": "1/2"}
    return Config.from_dict({"training": {**base, **training}})

out = {}
trainer = ShardTrainer(cfg())
losses = [trainer.train_step() for _ in range(3)]
acc, loss, n = trainer.evaluate(100)
out["builtin"] = {"task": trainer.task_name, "losses": losses, "evaluated": n, "accuracy": acc}
out["probe"] = probe(cfg())
errors = {}
for model in ("resnet18", "vgg11"):
    try:
        build_model(model)
    except ValueError as exc:
        errors[model] = str(exc)
errors["probe resnet18"] = probe(cfg(model="resnet18", data="synthetic", synthetic_samples=64))["error"]
errors["imagefolder"] = probe(Config.from_dict({"training": {"task": "imagefolder", "device": "cpu"},
                                                "task": {"root": data_dir}}))["error"]
try:
    cifar10(True, data_dir)
except DataError as exc:
    errors["cifar10"] = str(exc)
out["errors"] = errors
out["torchvision_imported"] = sorted(m for m in sys.modules if m.split(".")[0] == "torchvision")
print(json.dumps(out))
"""


def test_the_builtin_task_trains_without_torchvision(tmp_path: Path) -> None:
    write_idx(tmp_path / "fashion", 200, seed=3)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TORCHVISION, str(tmp_path / "fashion")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["torchvision_imported"] == []
    builtin = out["builtin"]
    assert builtin["task"] == "cnn/fashion-mnist" and builtin["evaluated"] == 100
    assert all(np.isfinite(builtin["losses"])) and 0 <= builtin["accuracy"] <= 1
    assert out["probe"]["ok"] is True and out["probe"]["train_items"] == 100  # shard 1/2 of 200
    errors = out["errors"]
    assert set(errors) == {"resnet18", "vgg11", "probe resnet18", "imagefolder", "cifar10"}
    for what, message in errors.items():
        assert "needs torchvision, which is not installed: install p2pnode[vision]" in message, (what, message)
        assert "\n" not in message
    assert errors["resnet18"].startswith("model 'resnet18' needs torchvision")
    assert errors["imagefolder"].startswith("task 'imagefolder': it needs torchvision")
    assert errors["cifar10"].startswith("training.data = cifar10 needs torchvision")


START_WITHOUT_TORCHVISION = """
import sys
sys.modules["torchvision"] = None  # as if not installed: import fails, find_spec says None
from p2pnode.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_start_refuses_a_model_that_needs_torchvision_with_exit_2(tmp_path: Path) -> None:
    """Before anything is written, as every configuration error (p2pnode/preflight.py)."""
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-c", START_WITHOUT_TORCHVISION, "start", "--model", "resnet18",
                           "--data", "synthetic", "--listen", "127.0.0.1:0", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("p2pnode: config error: training.model: resnet18 needs torchvision, which is "
                                   "not installed: install p2pnode[vision] (pip install 'p2pnode[vision]')")
    assert not state.exists()
