"""Optional shared-secret request signing (HMAC-SHA256).

The signature covers method, path (with query), a timestamp and the body's SHA-256, so a
captured request cannot be replayed after ``max_skew`` seconds or altered. The server checks it
with ``hmac.compare_digest`` before it decodes any body.
"""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER_SIG = "X-P2P-Signature"
HEADER_TS = "X-P2P-Timestamp"


def sign(secret: bytes, method: str, path_qs: str, body: bytes, ts: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if ts is None else ts
    digest = hashlib.sha256(body).hexdigest()
    msg = f"{method.upper()}\n{path_qs}\n{ts}\n{digest}".encode()
    return {HEADER_TS: str(ts), HEADER_SIG: hmac.new(secret, msg, hashlib.sha256).hexdigest()}


def verify(secret: bytes, method: str, path_qs: str, body: bytes, headers: dict[str, str] | object,
           max_skew: float = 300.0, now: float | None = None) -> bool:
    get = getattr(headers, "get")
    ts_text, sig = get(HEADER_TS), get(HEADER_SIG)
    if not ts_text or not sig:
        return False
    try:
        ts = int(ts_text)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > max_skew:
        return False
    expected = sign(secret, method, path_qs, body, ts)[HEADER_SIG]
    return hmac.compare_digest(expected, sig)
