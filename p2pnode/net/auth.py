"""Optional shared-secret authentication (HMAC-SHA256), in both directions.

Requests: the signature covers method, path (with query), a timestamp, a random nonce and the
body's SHA-256, so a captured request cannot be altered, nor replayed after ``max_skew``
seconds; within them :class:`ReplayCache` refuses a signature seen before. The cache lives in
memory, so it also refuses a request stamped before it was made (the server process's start,
less ``START_SKEW``): after a restart it cannot vouch for what it saw before, and a request
captured then could otherwise be played back within the window. The server checks it with
``hmac.compare_digest`` before it decodes any body.

Answers: the server signs every answer to a signed request over the request's signature, the
status and the body's SHA-256 (:func:`sign_response`), and the client refuses an answer whose
signature does not match (:func:`verify_response`): a model pulled from a peer, or a
membership reply, cannot be altered on the way nor be an old answer played back.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping

HEADER_SIG = "X-P2P-Signature"
HEADER_TS = "X-P2P-Timestamp"
HEADER_NONCE = "X-P2P-Nonce"
HEADER_RESPONSE_SIG = "X-P2P-Response-Signature"
#: seconds before a replay cache was made (its server's start) that a request may be stamped
#: and still be taken: a peer's clock may run this far behind ours. Anything older may have
#: been seen by this server's previous life, whose cache is gone: refused as a replay
START_SKEW = 1.0


def _request_mac(secret: bytes, method: str, path_qs: str, ts: int, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    msg = f"{method.upper()}\n{path_qs}\n{ts}\n{nonce}\n{digest}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path_qs: str, body: bytes, ts: int | None = None,
         nonce: str | None = None) -> dict[str, str]:
    ts = int(time.time()) if ts is None else ts
    nonce = secrets.token_hex(12) if nonce is None else nonce
    return {HEADER_TS: str(ts), HEADER_NONCE: nonce,
            HEADER_SIG: _request_mac(secret, method, path_qs, ts, nonce, body)}


def verify(secret: bytes, method: str, path_qs: str, body: bytes, headers: Mapping[str, str],
           max_skew: float = 300.0, now: float | None = None) -> bool:
    ts_text, sig, nonce = headers.get(HEADER_TS), headers.get(HEADER_SIG), headers.get(HEADER_NONCE)
    if not ts_text or not sig or not nonce or len(nonce) > 64:
        return False
    try:
        ts = int(ts_text)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > max_skew:
        return False
    return hmac.compare_digest(_request_mac(secret, method, path_qs, ts, nonce, body), sig)


def sign_response(secret: bytes, request_sig: str, status: int, body: bytes | bytearray | memoryview) -> str:
    """The answer's signature: bound to the request it answers, its status and its body."""
    return sign_response_digest(secret, request_sig, status, hashlib.sha256(body).hexdigest())


def sign_response_digest(secret: bytes, request_sig: str, status: int, body_sha256: str) -> str:
    """:func:`sign_response` from the body's SHA-256 (hex), computed beforehand: a streamed
    answer's body is hashed off the event loop, once per body, before its headers go out."""
    msg = f"RESPONSE\n{request_sig}\n{status}\n{body_sha256}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify_response(secret: bytes, request_sig: str, status: int, body: bytes, headers: Mapping[str, str]) -> bool:
    sig = headers.get(HEADER_RESPONSE_SIG)
    return bool(sig) and hmac.compare_digest(sign_response(secret, request_sig, status, body), str(sig))


class ReplayCache:
    """Request signatures seen within the accepted window, so none is accepted twice.

    Entries expire ``2 * max_skew`` after their timestamp (a timestamp is accepted up to
    ``max_skew`` either side of now). A request stamped at or below ``floor`` is refused as
    possibly replayed. The floor starts just under ``born - start_skew`` (``born``: when the
    cache was made, by default now): the cache knows nothing of what came before it, e.g. of
    the requests a restarted server took in its previous life. The table is bounded: when
    full, the oldest entry goes and its timestamp raises the floor (only under a flood of
    signed requests: members' requests are fresh).
    """

    def __init__(self, max_skew: float = 300.0, max_entries: int = 200_000, born: float | None = None,
                 start_skew: float = START_SKEW) -> None:
        self.max_skew = max_skew
        self.max_entries = max_entries
        self._seen: OrderedDict[str, int] = OrderedDict()  # signature -> timestamp, oldest first
        born = time.time() if born is None else born
        self.floor = math.ceil(born - start_skew) - 1  # the largest whole second before born - start_skew

    def __len__(self) -> int:
        return len(self._seen)

    def fresh(self, sig: str, ts: int, now: float | None = None) -> bool:
        """True the first time a (verified) signature is seen; False for a replay."""
        now = time.time() if now is None else now
        while self._seen:
            oldest_sig, oldest_ts = next(iter(self._seen.items()))
            if oldest_ts >= now - 2 * self.max_skew:
                break
            del self._seen[oldest_sig]
        if ts <= self.floor or sig in self._seen:
            return False
        self._seen[sig] = ts
        while len(self._seen) > self.max_entries:
            _, evicted_ts = self._seen.popitem(last=False)
            self.floor = max(self.floor, evicted_ts)
        return True
