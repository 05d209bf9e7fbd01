"""A big model's snapshot served from a copy in a file (wire/served_file.py), not in the daemon's
memory: the same bytes and SHA-256 as the copy in memory; a publish during the copy throws it
away; streamed by a real aiohttp server (net/stream.py) each slice's pages are let go, and the
client gets the body whole, its signature checked."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import time
from pathlib import Path

import numpy as np
from aiohttp import web
from daemon_util import serve_get

from p2pnode.net.auth import HEADER_RESPONSE_SIG, HEADER_SIG, sign_response_digest
from p2pnode.net.client import PeerClient
from p2pnode.net.deadline import Transfer
from p2pnode.net.stream import PartsResponse
from p2pnode.wire.codec import encode
from p2pnode.wire.payload import ModelSpec, Snapshot, TensorSpec
from p2pnode.wire.public_file import PublicFile, PublicReader
from p2pnode.wire.served import ServedModel
from p2pnode.wire.served_file import PATTERN, ReleasingParts, write_snapshot

SPEC = ModelSpec("fpS", [TensorSpec(f"w{i}", (1024, 1024)) for i in range(4)])  # 4 x 4 MiB
SECRET = b"k" * 32


def _file(tmp_path: Path) -> tuple[PublicFile, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = {s.name: rng.standard_normal(s.numel).astype(np.float32) for s in SPEC.tensors}
    return PublicFile(tmp_path / "public.xhat", SPEC, x, 3), x


def test_the_copy_in_a_file_is_the_snapshot_and_leaves_no_file(tmp_path: Path) -> None:
    f, x = _file(tmp_path)
    served = ServedModel(SPEC, "me", "e0")
    served.attach(PublicReader(f.path), "e0", 3)
    result = served.serve(None, None)
    assert result.kind == "snapshot" and result.version == 3 and result.snapshot is not None
    assert isinstance(result.snapshot.parts, ReleasingParts)  # a mapping, not a copy in memory
    _, _, step, loss = PublicReader(f.path).state()
    want = encode(Snapshot(SPEC.header("snapshot", "me", "e0", 3, base_version=-1, step=step, loss=loss), x))
    assert bytes(result.body) == want
    assert result.snapshot.sha256() == hashlib.sha256(want).hexdigest()
    # the copy keeps its name while it is mapped (so that letting the mapping go frees nothing
    # on the dropping thread), and goes once the answer and the cache have let it go
    assert len(list(tmp_path.glob(PATTERN))) == 1
    del result
    served.attach(PublicReader(f.path), "e0", 3)  # a new worker's file: the cached copy is dropped
    gc.collect()
    _gone(tmp_path)


def _gone(folder: Path) -> None:
    """Only x̂'s file is left in ``folder`` once the unlinking thread has caught up."""
    deadline = time.monotonic() + 10
    while sorted(p.name for p in folder.iterdir()) != ["public.xhat"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(p.name for p in folder.iterdir()) == ["public.xhat"]


def test_a_publish_during_the_copy_throws_it_away(tmp_path: Path) -> None:
    f, _ = _file(tmp_path)
    reader = PublicReader(f.path)
    f.begin()  # a publish under way
    assert write_snapshot(reader, SPEC, "me", "e0", tmp_path) is None
    f.end(4, 1, 0.5)
    seq = reader.state()[0]

    class Moving(PublicReader):  # the worker publishes while the copy is read
        def tensor(self, name: str) -> np.ndarray:
            if name == "w2":
                f.begin()
                f.end(5, 2, 0.5)
            return super().tensor(name)
    assert write_snapshot(Moving(f.path), SPEC, "me", "e0", tmp_path) is None
    assert reader.state()[0] == seq + 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["public.xhat"]  # no copy left behind
    made = write_snapshot(reader, SPEC, "me", "e0", tmp_path)
    assert made is not None and made[0] == 5
    del made
    gc.collect()
    _gone(tmp_path)


def test_streamed_from_the_mapping_slice_by_slice(tmp_path: Path) -> None:
    f, _ = _file(tmp_path)
    served = ServedModel(SPEC, "me", "e0")
    served.attach(PublicReader(f.path), "e0", 3)
    result = served.serve(None, None)
    assert result.snapshot is not None
    snapshot = result.snapshot
    released: list[int] = []
    parts = snapshot.parts
    assert isinstance(parts, ReleasingParts)
    release = parts.release

    def counting(view: memoryview) -> None:
        released.append(view.nbytes)
        release(view)
    parts.release = counting  # type: ignore[method-assign]

    async def handler(request: web.Request) -> web.StreamResponse:
        sig = sign_response_digest(SECRET, request.headers.get(HEADER_SIG, ""), 200, snapshot.sha256())
        return PartsResponse(parts, snapshot.sha256, headers={HEADER_RESPONSE_SIG: sig})

    async def main() -> bytes:
        runner, addr = await serve_get("/v1/model", handler)
        try:
            async with PeerClient(SECRET) as client:
                answer = await client.fetch(addr, "/v1/model", 5.0, Transfer(5.0, 30.0, 1024.0), 1 << 30, gzip=False)
            return bytes(answer.body)
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == bytes(result.body)
    assert sum(released) == snapshot.nbytes and max(released) <= 1 << 20  # every slice let go once written
