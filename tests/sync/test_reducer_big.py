"""The reducer at a big model's size: a phase as long as a model is averaged slice by slice and
off the event loop, to the same bits as the whole-array way, outliers included."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from p2pnode.sync import outliers
from p2pnode.sync.messages import FINAL, FINAL_ROUND
from p2pnode.sync.outliers import mean_in_chunks, replace_outliers
from p2pnode.sync.reducer import OFF_LOOP, Reducer
from p2pnode.sync.values import decode, encode


def parts(n: int, size: int, outlier: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    out = [rng.standard_normal(size).astype(np.float32) for _ in range(n)]
    if outlier:
        out[1] = out[1] * np.float32(-100.0)
    return out


def whole(ps: list[np.ndarray], threshold: float) -> np.ndarray:
    """The reducer's mean as it was computed before slicing."""
    replaced, _, _ = replace_outliers(ps, threshold)
    total = np.zeros(ps[0].shape, dtype=np.float64)
    for p in replaced:
        total += p
    return total / len(ps)


def test_sliced_mean_equals_the_whole_array_mean(monkeypatch) -> None:
    monkeypatch.setattr(outliers, "CHUNK", 1000)  # many slices, one of them short
    for outlier in (False, True):
        ps = parts(4, 10_500, outlier)
        mean, over, _ = mean_in_chunks(ps, 20.0)
        assert (1 in over) == outlier and len(over) == outlier
        assert np.array_equal(mean, whole(ps, 20.0))
        as32, _, _ = mean_in_chunks(ps, 20.0, np.float32)
        assert np.array_equal(as32, whole(ps, 20.0).astype(np.float32))


def test_a_model_sized_final_mean_is_computed_off_the_loop() -> None:
    names = ["a", "b", "c"]
    ps = parts(3, OFF_LOOP + 5, outlier=True)

    async def main() -> tuple[list, int]:
        red = Reducer(30.0, lambda: set(names), final_wait=30.0, values="float16", outlier=20.0)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        outs = await asyncio.gather(*(red.contribute(n, FINAL, FINAL_ROUND, encode(p, "float32"))
                                      for n, p in zip(names, ps)))
        t.cancel()
        return outs, ticks

    outs, ticks = asyncio.run(main())
    assert all(o.count == 3 and o.included for o in outs)
    assert outs[0].data == outs[2].data
    got = decode(outs[0].data, "float32", OFF_LOOP + 5)
    assert np.array_equal(got, whole(ps, 20.0).astype(np.float32))
    assert ticks > 3  # the loop ran other tasks while the mean was computed


def test_a_final_model_is_a_view_of_its_body_checked_slice_by_slice() -> None:
    from p2pnode.sync.outcome import SyncRefused, parse

    body = np.arange(10, dtype=np.float32).tobytes()
    arr = parse(body, 10, "float32")
    assert not arr.flags.owndata and np.array_equal(arr, np.arange(10, dtype=np.float32))
    bad = np.arange(3_000_000, dtype=np.float32)
    bad[2_500_000] = np.nan  # in a later slice than the first
    for data, length in ((bad.tobytes(), None), (body, 11), (body[:-1], None)):
        with pytest.raises(SyncRefused):
            parse(data, length, "float32")


def test_the_models_mean_waits_longer_for_bigger_models() -> None:
    """A model of 25 MB may come 2 s after the first (reducer.FINAL_RATE): with the step's 0.2 s
    rule alone the mean closed without it, and that node ended training with its own model."""
    names = ["a", "b"]
    ps = parts(2, 6_250_000, outlier=False)

    async def main() -> list:
        red = Reducer(0.2, lambda: set(names), final_wait=0.2, values="float16")
        first = asyncio.create_task(red.contribute("a", FINAL, FINAL_ROUND, encode(ps[0], "float32")))
        await asyncio.sleep(1.0)  # a 25 MB upload on a slow link, longer than the step's rule
        second = await red.contribute("b", FINAL, FINAL_ROUND, encode(ps[1], "float32"))
        return [await first, second]

    outs = asyncio.run(main())
    assert [o.count for o in outs] == [2, 2] and all(o.included for o in outs)
