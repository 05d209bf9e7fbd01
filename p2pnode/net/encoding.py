"""gzip for model answers: HTTP's own ``Content-Encoding``, asked for by the fetching node.

A top-k delta's index gaps and int8 values are far from random bytes (most gaps are small, most
values near the top-k threshold): gzip takes about a third off the model bytes of a low-density
publish, where the indices weigh as much as the values (docs/BENCHMARKS.md). Snapshots (float32)
and other answers that gzip would not shrink go as they are. A node answers in gzip only a
request that asks with ``gzip=1`` in its query as well as ``Accept-Encoding: gzip``: aiohttp's
client sends ``Accept-Encoding: gzip, deflate`` by default, and a p2pnode of an older version,
which leaves the body as it came, would take a gzip answer for a payload and refuse it. Such a
peer gets the same bytes as before.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Mapping

#: answers shorter than this go as they are: gzip's 18-byte frame and the work are not worth it
MIN_BYTES = 256
LEVEL = 6
#: longer answers are packed at gzip's fastest level, and answers over MAX_BYTES not at all: a
#: big model's delta (a new one for every fetch) cost seconds of CPU before its answer could
#: begin (a 50 MB delta: 2-5 s at level 6 on a loaded core, longer than the fetch's wait for it)
FAST_ABOVE = 1 << 20
FAST_LEVEL = 1
MAX_BYTES = 8 << 20
#: the query parameter a fetch that can inflate adds (``with_gzip_marker``)
MARKER = ("gzip", "1")


def with_gzip_marker(path_qs: str) -> str:
    """``path_qs`` with the query parameter that says "a gzip answer is welcome" (the client's
    side of :func:`asks_for_gzip`)."""
    return f"{path_qs}{'&' if '?' in path_qs else '?'}{MARKER[0]}={MARKER[1]}"


def asks_for_gzip(query: Mapping[str, str], accept_encoding: str) -> bool:
    """Whether a request may be answered in gzip: it carries the marker *and* takes gzip."""
    return query.get(MARKER[0]) == MARKER[1] and wants_gzip(accept_encoding)


def wants_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (``gzip``, or ``gzip;q=...`` with q > 0)."""
    for item in accept_encoding.split(",")[:16]:
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() != "gzip":
            continue
        q = params.strip().lower()
        if not q.startswith("q="):
            return not q
        try:
            return float(q[2:]) > 0
        except ValueError:
            return False
    return False


def gzip_if_smaller(body: bytes | bytearray | memoryview) -> bytes | None:
    """``body`` as one gzip member (no name, no time: the same bytes for the same body), or None
    where it is over MAX_BYTES, or
    where that would not be smaller."""
    if not MIN_BYTES <= len(body) <= MAX_BYTES:
        return None
    packed = gzip.compress(body, LEVEL if len(body) <= FAST_ABOVE else FAST_LEVEL, mtime=0)
    return packed if len(packed) < len(body) else None


def gunzip(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """A gzip body inflated; ValueError if it is not exactly one gzip member, or would inflate
    past ``limit`` bytes (a small body may not make us hold a huge one)."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"bad gzip body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"gzip body inflates past the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("gzip body truncated, or followed by other bytes")
    return out
