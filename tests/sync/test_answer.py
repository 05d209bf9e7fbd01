"""The reducer's answer streamed from parts: the same msgpack bytes as packing it whole, the
mean shared by every answer rather than copied into each, and readable by a real client."""

from __future__ import annotations

import asyncio

import aiohttp
import msgpack
import numpy as np
import pytest

from p2pnode.net.stream import PartsResponse
from p2pnode.sync.answer import answer, parts_of
from tests.daemon_util import serve_get


def fields(blob: bytes | memoryview) -> dict:
    return {"round": 7, "count": 3, "included": True, "behind": False, "data": blob, "step_down": 0,
            "replay": [[1, b"ab", b"c"]], "pace": 0.25, "new_group": False}


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 3 << 20])
def test_parts_join_to_what_packb_gives(size: int) -> None:
    blob = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    got = b"".join(bytes(p) for p in parts_of(fields(blob)))
    assert got == msgpack.packb(fields(blob), use_bin_type=True)


def test_a_big_mean_is_shared_not_copied() -> None:
    mean = np.arange(1 << 20, dtype=np.float32)
    view = memoryview(mean).cast("B")
    resp, nbytes = answer(fields(view))
    assert isinstance(resp, PartsResponse) and nbytes == resp.nbytes > view.nbytes
    assert any(isinstance(p, memoryview) and p.obj is mean for p in resp.parts)
    small, n = answer(fields(b"x" * 100))
    assert not isinstance(small, PartsResponse) and n == len(msgpack.packb(fields(b"x" * 100), use_bin_type=True))


def test_a_client_reads_the_streamed_answer() -> None:
    mean = np.random.default_rng(1).standard_normal(3 << 20).astype(np.float32)

    async def main() -> dict:
        async def handler(request):
            return answer(fields(memoryview(mean).cast("B")))[0]

        runner, addr = await serve_get("/a", handler)
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://{addr}/a") as r:
                return msgpack.unpackb(await r.read(), raw=False)
        finally:
            await runner.cleanup()

    got = asyncio.run(main())
    assert np.array_equal(np.frombuffer(got["data"], np.float32), mean) and got["replay"] == [[1, b"ab", b"c"]]
