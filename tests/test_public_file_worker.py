"""The worker's x̂ in a file (a big model's: here the threshold is lowered), served by a daemon
that keeps no copy: replicas built from what it serves equal the worker's x̂ bit for bit, and
x̂ stays readable while a publish selects (only the short update makes readers retry)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from smaps import mapped_rss
from torch import nn

from p2pnode.compression.registry import build_sparsifier
from p2pnode.wire.codec import decode
from p2pnode.wire.payload import ModelSpec
from p2pnode.wire.public_file import PublicReader
from p2pnode.wire.replica import Replica
from p2pnode.wire.served import ServedModel
from p2pnode.worker import public
from p2pnode.worker.public import DeltaPublisher, floating_state


class Watching:
    """top-k that, at each selection, checks that the daemon could read x̂ right then."""

    def __init__(self, reader: list[PublicReader]) -> None:
        self.inner = build_sparsifier("topk:density=0.2")
        self.reader = reader
        self.readable: list[bool] = []

    def select(self, flat: torch.Tensor) -> torch.Tensor:
        if self.reader:
            r = self.reader[0]
            self.readable.append(r.read(r.state()[1]) is not None)
        return self.inner.select(flat)


def test_served_from_the_worker_file_bit_equal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(public, "DISK_FROM", 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    spec = ModelSpec.from_state_dict(floating_state(model), "fp-file")
    readers: list[PublicReader] = []
    sparsifier = Watching(readers)
    pub = DeltaPublisher(model, spec, sparsifier, "me", "e0", 0, "int8", tmp_path)  # type: ignore[arg-type]
    assert pub.file is not None and pub.file.path.parent == tmp_path
    snapshot, path, genesis = pub.hello_fields(0, float("nan"))
    assert snapshot == b"" and path == str(pub.file.path) and genesis
    readers.append(PublicReader(path))
    served = ServedModel(spec, "me", "e0")
    served.attach(readers[0], "e0", 0, genesis)
    replica = Replica(spec, "me")
    replica.apply(decode(served.serve(None, None).body, spec), validate=False)
    old = Replica(spec, "me")  # stays at version 1: brought up by a merged delta
    for v in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        served.publish(pub.publish(v + 1, 1.0))
        if v == 0:
            old.apply(decode(served.serve(None, None).body, spec), validate=False)
        replica.apply(decode(served.serve(replica.version, "e0").body, spec))
    assert served.serve(old.version, "e0").kind == "delta"
    old.apply(decode(served.serve(old.version, "e0").body, spec))
    # a whole publish (after adopting a peer's model): every entry, indices a shared range
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.rand_like(p) + 0.5)  # every entry moves
    served.publish(pub.publish(6, 1.0, full=True))
    for r in (replica, old):
        r.apply(decode(served.serve(r.version, "e0").body, spec))
    for name, x in floating_state(model).items():
        assert np.allclose(pub.xhat[name].numpy(), x.detach().reshape(-1).numpy(), atol=1e-6), name  # x̂ ≈ the model
    for r in (replica, old):
        assert r.version == pub.version == 6
        for name, x in pub.xhat.items():
            assert np.array_equal(r.arrays[name], x.numpy()), name
    assert sparsifier.readable and all(sparsifier.readable)  # never mid-publish while selecting


def test_xhat_leaves_the_resident_set_between_publishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2048² layer (16 MB) published three times: its x̂ pages are let go after every publish
    (they were all resident before: the selection reads every entry, the update writes 20 % of
    them, on every page), and the replica built from the deltas still equals the file's x̂."""
    monkeypatch.setattr(public, "DISK_FROM", 0)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(2048, 2048, bias=False))
    spec = ModelSpec.from_state_dict(floating_state(model), "fp-release")
    pub = DeltaPublisher(model, spec, build_sparsifier("topk:density=0.2"), "me", "e0", 0, "float32", tmp_path)
    assert pub.file is not None
    _, path, genesis = pub.hello_fields(0, float("nan"))
    assert 0 <= mapped_rss(pub.file.path) < 1 << 20
    reader = PublicReader(path)
    served = ServedModel(spec, "me", "e0")
    served.attach(reader, "e0", 0, genesis)
    replica = Replica(spec, "me")
    replica.apply(decode(served.serve(None, None).body, spec), validate=False)
    for step in range(3):
        with torch.no_grad():
            model[0].weight.add_(torch.randn_like(model[0].weight) * 0.01)
        touched = sum(float(x.sum()) for x in pub.xhat.values())  # every page of x̂ read back in
        assert mapped_rss(pub.file.path) > 15 << 20 and np.isfinite(touched)
        served.publish(pub.publish(step + 1, 1.0))
        assert mapped_rss(pub.file.path) < 1 << 20
        replica.apply(decode(served.serve(replica.version, "e0").body, spec))
    got = reader.read(pub.version)
    assert replica.version == pub.version == 3
    assert got is not None and all(np.array_equal(got[k], replica.arrays[k]) for k in got)
