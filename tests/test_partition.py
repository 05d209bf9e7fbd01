"""Data partitions: disjoint, covering, deterministic, and as skewed as they say; the unpacked-data
cache keyed by source."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode import partition as parts
from p2pnode.config import Config, ConfigError, set_option
from p2pnode.data import DataError, Split, fashion_mnist, shard

SPECS = ["iid", "dirichlet:alpha=0.1", "dirichlet:alpha=0.5", "dirichlet:alpha=100", "classes:k=2", "classes:k=1"]


def labels_of(n: int, classes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("count", [1, 3, 4, 8])
def test_shards_are_disjoint_cover_the_data_and_are_deterministic(spec: str, count: int) -> None:
    labels = labels_of(6000, 10, 1)
    part = parts.parse(spec)
    shards = parts.assign(labels, part, count, seed=7)
    assert len(shards) == count
    joined = np.concatenate(shards)
    assert len(joined) == len(labels) and len(np.unique(joined)) == len(labels)  # disjoint, covering
    # Each node computes only its own shard, yet gets the same one as the whole partition says.
    for i in range(count):
        again = parts.shard_indices(labels, part, i, count, seed=7)
        assert np.array_equal(again, shards[i])
    # another seed gives another draw (for anything random)
    if part.kind != "iid" and count > 1:
        other = parts.assign(labels, part, count, seed=8)
        assert any(not np.array_equal(a, b) for a, b in zip(shards, other))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(40, 800), classes=st.integers(2, 12), count=st.integers(1, 6),
       alpha=st.floats(0.05, 50), seed=st.integers(0, 2**32 - 1))
def test_dirichlet_property(n: int, classes: int, count: int, alpha: float, seed: int) -> None:
    labels = labels_of(n, classes, seed % 1000)
    try:
        shards = parts.assign(labels, parts.Partition("dirichlet", alpha=alpha), count, seed)
    except parts.PartitionError:
        return  # a draw that cannot give every node its minimum is refused, never half-made
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))
    assert min(len(s) for s in shards) >= min(10, n // count)
    total = np.zeros(max(parts.histogram(labels, classes).__len__(), classes), dtype=int)
    for s in shards:
        total += np.array(parts.histogram(labels[s], classes))
    assert total.tolist() == parts.histogram(labels, classes)


def test_skew_is_what_the_spec_says() -> None:
    labels = np.repeat(np.arange(10), 6000)  # Fashion-MNIST's class balance
    def top2_share(spec: str) -> float:
        shares = []
        for s in parts.assign(labels, parts.parse(spec), 4, seed=0):
            h = np.sort(np.array(parts.histogram(labels[s], 10)))[::-1]
            shares.append(h[:2].sum() / h.sum())
        return float(np.mean(shares))

    assert top2_share("iid") < 0.21  # 2 of 10 equal classes
    assert top2_share("dirichlet:alpha=100") < 0.25
    assert top2_share("dirichlet:alpha=0.1") > 0.6  # a few classes dominate each node
    for s in parts.assign(labels, parts.parse("classes:k=2"), 4, seed=0):
        assert len(np.unique(labels[s])) <= 4  # two chunks of sorted labels: at most 2 classes each


def test_iid_is_the_old_interleaved_shard() -> None:
    labels = labels_of(1003, 10, 3)
    for i, s in enumerate(parts.assign(labels, parts.parse("iid"), 4, seed=0)):
        assert np.array_equal(s, np.arange(i, 1003, 4))


@pytest.mark.parametrize("bad", ["dirichlet", "dirichlet:alpha=0", "dirichlet:alpha=-1", "dirichlet:alpha=inf",
                                 "dirichlet:alpha=x", "dirichlet:k=2", "classes:k=0", "classes:k=1.5", "zipf",
                                 "iid:alpha=1", "classes:k"])
def test_bad_specs_are_one_line_config_errors(bad: str) -> None:
    cfg = Config()
    with pytest.raises(ConfigError, match="training.partition"):
        set_option(cfg, "training.partition", bad)
        Config.from_dict(cfg.to_dict())


def test_too_skewed_for_the_nodes_is_a_clear_error() -> None:
    import torch

    labels = np.zeros(30, dtype=np.int64)  # one class: Dir(0.001) gives nearly all of it to one node
    with pytest.raises(parts.PartitionError, match="leaves a node"):
        parts.assign(labels, parts.Partition("dirichlet", alpha=0.001), 3, seed=0)
    split = Split(torch.zeros(30, 1, 2, 2), torch.from_numpy(labels))
    with pytest.raises(DataError, match="training.partition"):
        shard(split, 0, 3, "dirichlet:alpha=0.001")


def test_shard_of_a_split_matches_its_histogram() -> None:
    import torch

    labels = torch.from_numpy(labels_of(2000, 10, 5))
    split = Split(torch.arange(2000, dtype=torch.float32).view(2000, 1, 1, 1), labels)
    idx = parts.shard_indices(labels.numpy(), parts.parse("dirichlet:alpha=0.3"), 2, 4, seed=11)
    got = shard(split, 2, 4, "dirichlet:alpha=0.3", seed=11)
    assert got.images.view(-1).long().tolist() == idx.tolist()  # the very samples, in order
    assert parts.histogram(got.labels.numpy(), 10) == parts.histogram(labels.numpy()[idx], 10)


# --- the unpacked-data cache is keyed by source -------------------------------------------------

def write_idx(folder: Path, n: int, fill: int) -> None:
    """Four tiny Fashion-MNIST IDX files (gzipped, as the Debian package ships them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", n), ("t10k", n)):
        images = struct.pack(">IIII", 0x803, count, 28, 28) + bytes([fill]) * (count * 28 * 28)
        labels = struct.pack(">II", 0x801, count) + bytes([fill % 10]) * count
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))


def test_cache_is_keyed_by_source(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    write_idx(tmp_path / "a", 5, fill=3)
    write_idx(tmp_path / "b", 7, fill=4)
    a = fashion_mnist(True, tmp_path / "a", cache)
    b = fashion_mnist(True, tmp_path / "b", cache)  # used to return a's files from the cache
    assert len(a) == 5 and a.labels.unique().tolist() == [3]
    assert len(b) == 7 and b.labels.unique().tolist() == [4]
    # the same source again comes from its own cache entry
    assert len(fashion_mnist(True, tmp_path / "a", cache)) == 5
    # a source whose files changed is unpacked again, not served stale
    write_idx(tmp_path / "a", 9, fill=5)
    assert len(fashion_mnist(True, tmp_path / "a", cache)) == 9
